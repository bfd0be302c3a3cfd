"""Whole-batch fetching (`IndexedDataset.batch`, `engine.batching.batches`) and the batched runtime's draw-ahead
streams give exactly the batches and RNG states of DataLoader's per-sample path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from fedhet.config import TrainConfig
from fedhet.core.seeding import seeded
from fedhet.data.datasets import IndexedDataset, Part
from fedhet.data.transforms import AddGaussianNoise, Compose, ToFloat
from fedhet.engine.batching import batches
from fedhet.runtimes.batched.data import BatchStream, ClientRng


class PerSample(Dataset):
    """Hides `IndexedDataset.batch`: DataLoader's per-sample collation."""

    def __init__(self, inner: IndexedDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        return self.inner[i]


def dataset(transform=None) -> IndexedDataset:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 255, (90, 7), generator=g, dtype=torch.uint8), torch.randint(0, 5, (90,), generator=g)
    return IndexedDataset([Part("a", x, y, np.arange(3, 80))], transform)


CFG = TrainConfig(batch_size=8, local_epochs=2, local_steps=None)


def drawn(ds: Dataset) -> tuple[list, torch.Tensor, float]:
    with seeded(0, 1, 2, "fit"):
        out = list(batches(ds, CFG))
        return out, torch.rand(3), float(np.random.rand())


@pytest.mark.parametrize("transform", [None, ToFloat(), Compose(ToFloat(), AddGaussianNoise(0.1))])
def test_whole_batches_equal_per_sample_collation(transform) -> None:
    ds = dataset(transform)
    fast, slow = drawn(ds), drawn(PerSample(ds))
    assert len(fast[0]) == len(slow[0]) == 20  # 2 epochs of 77 samples, batch 8 (the singleton 77th dropped)
    for (xa, ya), (xb, yb) in zip(fast[0], slow[0], strict=True):
        assert torch.equal(xa, xb) and xa.dtype == xb.dtype and torch.equal(ya, yb) and ya.dtype == yb.dtype
    assert torch.equal(fast[1], slow[1]) and fast[2] == slow[2]  # the same RNG draws were consumed
    assert ds.needs_no_random_numbers == (transform is None or isinstance(transform, ToFloat))


@pytest.mark.parametrize("cfg", [CFG, TrainConfig(batch_size=8, local_steps=13)])  # 13: part of a 2nd epoch
@pytest.mark.parametrize("transform", [None, Compose(ToFloat(), AddGaussianNoise(0.1))])
def test_draw_ahead_streams_give_the_in_process_batches(transform, cfg: TrainConfig) -> None:
    ds = dataset(transform)
    with seeded(0, 1, 2, "fit"):
        want, after = list(batches(ds, cfg)), (torch.rand(3), float(np.random.rand()))
    stream = BatchStream(ClientRng(0, 1, 2), ds, cfg)
    got = [stream.next() for _ in range(stream.steps)]
    assert len(got) == len(want) == (13 if cfg.local_steps else 20)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want, strict=True))
    with pytest.raises(RuntimeError, match="exhausted"):
        stream.next()
    with stream.rng.active():  # the stream consumed exactly the client's in-process draws
        assert torch.equal(torch.rand(3), after[0]) and float(np.random.rand()) == after[1]


def test_evaluation_batches_in_order_equal_the_per_sample_loader() -> None:
    from torch.utils.data import DataLoader

    from fedhet.engine.batching import in_order

    ds = dataset(ToFloat())
    torch.manual_seed(0)
    fast, after_fast = list(in_order(ds, 16)), torch.rand(2)
    torch.manual_seed(0)
    slow, after_slow = list(DataLoader(PerSample(ds), batch_size=16, shuffle=False)), torch.rand(2)
    assert len(fast) == 5
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(fast, slow, strict=True))
    assert torch.equal(after_fast, after_slow)  # DataLoader's draw of its base seed is kept


@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize("samples", [77, 81])  # 81 = 10 x 8 + 1: the singleton last batch is dropped
def test_shuffled_epochs_draw_what_dataloader_draws(with_generator: bool, samples: int) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 255, (90, 7), generator=g, dtype=torch.uint8), torch.randint(0, 5, (90,), generator=g)
    ds = IndexedDataset([Part("a", x, y, np.arange(samples))], ToFloat())

    def run(data: Dataset) -> tuple[list, torch.Tensor, torch.Tensor | None]:
        gen = torch.Generator().manual_seed(5) if with_generator else None
        torch.manual_seed(3)
        out = list(batches(data, CFG, generator=gen))
        return out, torch.rand(2), None if gen is None else torch.rand(2, generator=gen)

    fast, slow = run(ds), run(PerSample(ds))
    assert len(fast[0]) == len(slow[0])
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(fast[0], slow[0], strict=True))
    assert torch.equal(fast[1], slow[1]) and (fast[2] is None or torch.equal(fast[2], slow[2]))


def test_a_client_rng_is_the_state_seeded_leaves_and_shared_outer_blocks_restore_the_caller() -> None:
    import random

    with seeded(7, 3, 11, "fit"):
        want = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    rng = ClientRng(7, 3, 11)
    with rng.active():
        got = ClientRng._capture()
    assert torch.equal(got[0], want[0]) and got[2] == want[2]
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b for a, b in zip(got[1], want[1],
                                                                                            strict=True))
    torch.manual_seed(0)
    np.random.seed(0)
    before = (torch.rand(1), np.random.rand())
    torch.manual_seed(0)
    np.random.seed(0)
    other = ClientRng(7, 3, 12)
    with ClientRng.one_after_another():
        for client in (rng, other):
            with client.active():
                torch.rand(5), np.random.rand(3)
    assert torch.equal(torch.rand(1), before[0]) and np.random.rand() == before[1]  # the caller's RNG is intact
    with seeded(7, 3, 11, "fit"):
        torch.rand(5), np.random.rand(3)
        after = (torch.rand(2), np.random.rand())
    with rng.active():
        resumed = (torch.rand(2), np.random.rand())
    assert torch.equal(after[0], resumed[0]) and after[1] == resumed[1]  # each client continued its own stream
