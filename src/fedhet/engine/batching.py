"""Mini-batches of one local pass: shuffling, the number of steps, the dropped singleton batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from fedhet.config import TrainConfig
from fedhet.core.batches import drops_singleton, num_steps, to_device
from fedhet.data.datasets import IndexedDataset


def batches(dataset: Dataset[Any], cfg: TrainConfig, generator: torch.Generator | None = None,
            device: torch.device | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled mini-batches for one pass: `local_steps` batches if set, else `local_epochs` epochs.

    Shuffling draws from `generator` (or torch's global RNG, which the engine seeds per client and round).
    A last batch of a single sample is dropped from each pass (`drops_singleton`): BatchNorm cannot train on
    one sample, and the sample is back in the next pass's shuffle. A dataset that takes a list of indices
    (`IndexedDataset.batch`) is asked for whole batches: the same batches from the same random draws as
    DataLoader's per-sample collation, without a Python call per sample.
    """
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        return
    bs = min(cfg.batch_size, n)
    if isinstance(dataset, IndexedDataset):  # DataLoader's own index sampler, one fetch per batch
        sampler = BatchSampler(RandomSampler(dataset, generator=generator), bs, drops_singleton(n, bs))
        loader = DataLoader(dataset, batch_size=None, sampler=sampler, generator=generator)
    else:
        loader = DataLoader(dataset, batch_size=bs, shuffle=True, drop_last=drops_singleton(n, bs),
                            generator=generator)
    steps = num_steps(n, cfg)
    done = 0
    while done < steps:
        for x, y in loader:
            if device is not None:
                x, y = to_device(x, device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y
            done += 1
            if done >= steps:
                return


def in_order(dataset: Dataset[Any], batch_size: int) -> DataLoader[Any]:
    """The dataset's samples in order, `batch_size` at a time (evaluation): DataLoader's own loader, asked for
    whole batches when the dataset takes a list of indices (`IndexedDataset.batch`, the same values)."""
    if isinstance(dataset, IndexedDataset):
        return DataLoader(dataset, batch_size=None, sampler=BatchSampler(SequentialSampler(dataset), batch_size,
                                                                         False))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)
