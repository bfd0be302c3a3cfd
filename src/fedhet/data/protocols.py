"""Benchmark protocols applied to the loaded domains before clients are built: the splits and amounts a paper
used rather than each source's own (FedBN's Digits amounts, FLamby's Fed-Heart-Disease), and the check of
`data.feature_norm` (the normaliser a paper used for a feature dataset, e.g. SURF's L1 + z-score)."""

from __future__ import annotations

from fedhet.config import DataConfig
from fedhet.data.fedbn_split import check_percent, fedbn_domain
from fedhet.data.heart_disease import flamby_domain, heart_protocol
from fedhet.data.registry import DomainData
from fedhet.data.transforms import FEATURE_NORMS
from fedhet.errors import ConfigError, unknown_choice


def check_protocols(cfg: DataConfig, dataset: str, modality: str = "features") -> None:
    """ConfigError for a protocol setting that is invalid or does not apply to `dataset` (before loading)."""
    if cfg.fedbn_percent is not None:
        check_percent(cfg.fedbn_percent, dataset)
    heart_protocol(cfg.heart_preprocessing, dataset)
    if cfg.feature_norm is not None:
        if cfg.feature_norm not in FEATURE_NORMS:
            raise unknown_choice("data.feature_norm", cfg.feature_norm, FEATURE_NORMS)
        if modality != "features":
            raise ConfigError(f"data.feature_norm applies to feature-vector datasets only, not '{dataset}' "
                              f"({modality}); remove it")


def apply_protocols(cfg: DataConfig, dataset: str, data: dict[str, DomainData]) -> dict[str, DomainData]:
    """The loaded domains under the protocols `cfg` selects (unchanged when none applies)."""
    if cfg.fedbn_percent is not None:
        data = {n: fedbn_domain(d, n, cfg.fedbn_percent) for n, d in data.items()}
    if heart_protocol(cfg.heart_preprocessing, dataset):
        data = {n: flamby_domain(d, n) for n, d in data.items()}
    return data
