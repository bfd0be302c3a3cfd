"""FedBN's Digits protocol (Li et al., ICLR 2021, official code `med-air/FedBN`), used by FRAug's Digits table.

FedBN pools each domain's images (train and test), splits them once 80/20 stratified (test = 20% of the domain),
and cuts the 80% into partitions of 743.8 images (10% of USPS's 7,438 training images), so every domain gets
the same amount. `--percent p` keeps whole partitions for p >= 0.1 (0.1 -> 743, 0.2 -> 1,487) and the first
int(743 * 10 p) images of the first partition below that (0.01 -> 74). The split is made once, on disk, so it is
the same for every seed; here it is drawn from a fixed generator keyed by the domain name.

Differences from FedBN's files: the training images are taken in a class-interleaved random order, so every
prefix is stratified (FedBN's prefix of a shuffled list is only roughly so) and smaller amounts are nested in
larger ones, as FedBN's are; the pools are whatever the data root holds (the staged MNIST / MNIST-M are subsets).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from fedhet.data import partition as P
from fedhet.data.registry import DomainData
from fedhet.errors import ConfigError

PART_LEN = 743.8  # FedBN utils/data_preprocess.py: the partition length
TEST_FRACTION = 0.2  # FedBN: StratifiedShuffleSplit(test_size=0.2)
SPLIT_SEED = 2021  # fixed: the split does not depend on the experiment seed (FedBN's is made once)
DATASETS = ("digits",)


def train_size(percent: float) -> int:
    """FedBN's training images per domain for `--percent` (0.1 -> 743, 0.01 -> 74, 1.0 -> 7,438)."""
    if percent >= 0.1:
        return int(PART_LEN * int(round(percent * 10)))
    return int(int(PART_LEN) * percent * 10 + 1e-9)


def check_percent(percent: float, dataset: str) -> None:
    """Raise a ConfigError unless `percent` is a FedBN percent (0 < p <= 0.1, or a multiple of 0.1 up to 1)."""
    if dataset not in DATASETS:
        raise ConfigError(f"data.fedbn_percent is FedBN's Digits protocol and applies to dataset 'digits' only, "
                          f"not '{dataset}'; remove it (use data.fraction or data.max_train_per_client)")
    if not 0.0 < percent <= 1.0:
        raise ConfigError(f"data.fedbn_percent must be in (0, 1], got {percent}")
    if percent > 0.1 and abs(percent * 10 - round(percent * 10)) > 1e-9:
        raise ConfigError(f"data.fedbn_percent={percent}: above 0.1 FedBN counts whole 10% partitions; "
                          "use 0.1, 0.2, ..., 1.0 (or a value <= 0.1)")
    if train_size(percent) < 1:
        raise ConfigError(f"data.fedbn_percent={percent} gives no training image; use at least 0.00014")


def interleaved_order(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random order of all samples whose every prefix holds each class in proportion (within one sample)."""
    labels = np.asarray(labels)
    key = np.empty(len(labels), dtype=np.float64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        key[idx] = (np.arange(len(idx)) + rng.random()) / len(idx)
    return np.lexsort((rng.random(len(labels)), key))


def fedbn_domain(d: DomainData, name: str, percent: float) -> DomainData:
    """One domain under FedBN's protocol: pooled, 80/20 stratified, train_size(percent) training images."""
    x = d.x_train if d.x_test is None else torch.cat([d.x_train, d.x_test])
    y = d.y_train if d.y_test is None else torch.cat([d.y_train, d.y_test])
    labels = y.numpy()
    rng = np.random.default_rng([SPLIT_SEED, zlib.crc32(name.encode())])
    pool, test = P.stratified_split(labels, TEST_FRACTION, rng)
    n = train_size(percent)
    if n > len(pool):
        raise ConfigError(f"data.fedbn_percent={percent} asks for {n} training images of '{name}', whose 80% "
                          f"split holds {len(pool)}; use a smaller fedbn_percent or a fuller copy of '{name}'")
    train = np.sort(pool[interleaved_order(labels[pool], rng)[:n]])
    tr, te = torch.from_numpy(train), torch.from_numpy(test)
    note = f"{d.note}; FedBN split: {n} train of {len(pool)}, {len(test)} test (fedbn_percent={percent})"
    return DomainData(x[tr], y[tr], x[te], y[te], generated=d.generated, note=note)
