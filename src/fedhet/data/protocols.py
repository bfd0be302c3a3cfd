"""Benchmark protocols applied to the loaded domains before clients are built: the splits and amounts a paper
used rather than each source's own (FedBN's Digits amounts, FLamby's Fed-Heart-Disease)."""

from __future__ import annotations

from fedhet.config import DataConfig
from fedhet.data.fedbn_split import check_percent, fedbn_domain
from fedhet.data.heart_disease import flamby_domain, heart_protocol
from fedhet.data.registry import DomainData


def check_protocols(cfg: DataConfig, dataset: str) -> None:
    """ConfigError for a protocol setting that is invalid or does not apply to `dataset` (before loading)."""
    if cfg.fedbn_percent is not None:
        check_percent(cfg.fedbn_percent, dataset)
    heart_protocol(cfg.heart_preprocessing, dataset)


def apply_protocols(cfg: DataConfig, dataset: str, data: dict[str, DomainData]) -> dict[str, DomainData]:
    """The loaded domains under the protocols `cfg` selects (unchanged when none applies)."""
    if cfg.fedbn_percent is not None:
        data = {n: fedbn_domain(d, n, cfg.fedbn_percent) for n, d in data.items()}
    if heart_protocol(cfg.heart_preprocessing, dataset):
        data = {n: flamby_domain(d, n) for n, d in data.items()}
    return data
