"""Mini-batches of one local pass: shuffling, the number of steps, the dropped singleton batch."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from fedhet.config import TrainConfig
from fedhet.core.batches import drops_singleton, num_steps, to_device
from fedhet.core.protocols import SampleSet, num_samples
from fedhet.data.datasets import IndexedDataset


def batches(dataset: SampleSet, cfg: TrainConfig, generator: torch.Generator | None = None,
            device: torch.device | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled mini-batches for one pass: `local_steps` batches if set, else `local_epochs` epochs.

    Shuffling draws from `generator` (or torch's global RNG, which the engine seeds per client and round).
    A last batch of a single sample is dropped from each pass (`drops_singleton`): BatchNorm cannot train on
    one sample, and the sample is back in the next pass's shuffle. An in-memory `IndexedDataset` is asked for
    whole batches (`shuffled_epoch`): the same batches from the same random draws as DataLoader's, without its
    per-batch and per-sample Python calls.
    """
    n = num_samples(dataset)
    if n == 0:
        return
    bs = min(cfg.batch_size, n)
    if isinstance(dataset, IndexedDataset) and generator is None:
        loaded: Iterator[Any] = map(  # Any: a dataset's batch, (x, y) with x by modality
            dataset.batch, pass_indices(n, cfg))
    else:
        loader = DataLoader(dataset, batch_size=bs, shuffle=True, drop_last=drops_singleton(n, bs),
                            generator=generator)
        loaded = (batch for _ in itertools.count() for batch in loader)
    for x, y in itertools.islice(loaded, num_steps(n, cfg)):
        if device is not None:
            x, y = to_device(x, device, non_blocking=True), y.to(device, non_blocking=True)
        yield x, y


def pass_indices(n: int, cfg: TrainConfig) -> Iterator[torch.Tensor]:
    """The sample indices of each mini-batch of one pass over n samples (`num_steps` of them), epoch after
    epoch; each epoch's random numbers are drawn when its first batch is asked for, as DataLoader draws them."""
    bs = min(cfg.batch_size, n)
    epochs = (batch for _ in itertools.count() for batch in shuffled_epoch(n, bs, drops_singleton(n, bs)))
    return itertools.islice(epochs, num_steps(n, cfg))


def shuffled_epoch(n: int, batch_size: int, drop_last: bool) -> Iterator[torch.Tensor]:
    """The index batches of one epoch of `DataLoader(dataset, batch_size, shuffle=True, drop_last)` over n
    samples, drawing from torch's global RNG what DataLoader draws, in the same order (torch 2.x;
    tests/engine/test_batch_fetch.py compares the two): its iterator's base seed, then the seed of
    RandomSampler's own generator, which draws the permutation (and, at the epoch's end, a spare one that touches
    no global state)."""
    torch.empty((), dtype=torch.int64).random_()  # the iterator's (unused) worker base seed
    order = torch.Generator()
    order.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    perm = torch.randperm(n, generator=order)
    end = n - n % batch_size if drop_last else n
    for start in range(0, end, batch_size):
        yield perm[start:start + batch_size]


def in_order(dataset: SampleSet, batch_size: int) -> DataLoader[Any]:  # Any: as SampleSet's items
    """The dataset's samples in order, `batch_size` at a time (evaluation): DataLoader's own loader, asked for
    whole batches when the dataset takes a list of indices (`IndexedDataset.batch`, the same values)."""
    if isinstance(dataset, IndexedDataset):
        return DataLoader(dataset, batch_size=None, sampler=BatchSampler(SequentialSampler(dataset), batch_size,
                                                                         False))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)
