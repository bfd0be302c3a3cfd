"""Each client's mini-batches, drawn exactly as the in-process runtime draws them.

In-process, a client's fit runs inside `seeded(seed, round, client, "fit")`, and `engine.local.batches`
shuffles (DataLoader's RandomSampler) and augments (torchvision transforms) from torch's global RNG, which
is also seeded from (seed, round, client). `ClientRng` captures that seeded RNG state once and swaps it in
for every draw of that client only, so the batched runtime can interleave many clients' data streams and
still give each client the very batches (order AND augmentation) it would get in-process: the draws of one
client happen in the same order against the same RNG, and nothing else consumes that client's RNG
(the batched step itself draws no random numbers: dropout is rejected, see norm.py). A client's second pass
(Ditto's personal model) continues the same RNG, as in-process.

A stream draws ahead: up to `AHEAD_BYTES` of a client's next batches in one swap of its RNG (swapping the
global RNG state in and out per batch costs more than a small model's step). That is the same sequence of draws
on the same RNG, so the batches are the same.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fedhet.config import TrainConfig
from fedhet.core.batches import num_steps
from fedhet.core.seeding import derive_seed
from fedhet.data.datasets import IndexedDataset
from fedhet.engine.batching import batches

Batch = tuple[torch.Tensor, torch.Tensor]
AHEAD_BYTES = 1 << 22  # per client: 4 MiB of batches drawn at once (at least one batch, at most AHEAD_MAX)
AHEAD_MAX = 64


class ClientRng:
    """The global RNG states (torch CPU, numpy, random) of one client's `seeded(seed, rnd, cid, "fit")` block,
    resumable: `active()` swaps them in for a block and saves where they got to. The states are built directly
    (what `seeded` would leave in the global RNGs), without touching the global ones."""

    def __init__(self, seed: int, rnd: int, client_id: int, purpose: str = "fit") -> None:
        value = derive_seed(seed, rnd, client_id, purpose)
        gen = torch.Generator()
        gen.manual_seed(value)
        self._state = (gen.get_state(), np.random.RandomState(value % 2**32).get_state(),
                       random.Random(value).getstate())

    @staticmethod
    def _capture() -> tuple[torch.Tensor, Any, Any]:
        return torch.get_rng_state(), np.random.get_state(), random.getstate()

    @staticmethod
    def _restore(state: tuple[torch.Tensor, Any, Any]) -> None:
        torch.set_rng_state(state[0])
        np.random.set_state(state[1])
        random.setstate(state[2])

    @classmethod
    @contextmanager
    def one_after_another(cls) -> Iterator[None]:
        """A run of clients' `active()` blocks with nothing random between them (each client's `start`, each
        client's `finish`): the caller's RNG state is saved once before and restored once after, instead of
        around every block (numpy's state copy is ~0.3 ms each way)."""
        global _SHARED_OUTER
        if _SHARED_OUTER:  # already inside one: its caller's state is the one to restore
            yield
            return
        outer, _SHARED_OUTER = cls._capture(), True
        try:
            yield
        finally:
            _SHARED_OUTER = False
            cls._restore(outer)

    @contextmanager
    def active(self, torch_only: bool = False) -> Iterator[None]:
        """Run the block on this client's RNG; the caller's global RNG state is restored afterwards (inside
        `one_after_another`, at its end). `torch_only`: the block draws from torch's RNG alone (the data draws of
        a dataset whose samples need no random numbers), so numpy's and Python's states are left where they are."""
        if torch_only:
            outer_torch = torch.get_rng_state()
            torch.set_rng_state(self._state[0])
            try:
                yield
            finally:
                self._state = (torch.get_rng_state(), *self._state[1:])
                torch.set_rng_state(outer_torch)
            return
        outer = None if _SHARED_OUTER else self._capture()
        self._restore(self._state)
        try:
            yield
        finally:
            self._state = self._capture()
            if outer is not None:
                self._restore(outer)


_SHARED_OUTER = False  # inside ClientRng.one_after_another


class BatchStream:
    """One pass of `engine.local.batches(dataset, cfg)` for one client, drawn lazily on the client's RNG."""

    def __init__(self, rng: ClientRng, dataset: Dataset, cfg: TrainConfig) -> None:
        self.rng = rng
        self.steps = num_steps(len(dataset), cfg)  # type: ignore[arg-type]
        self.drawn = 0
        self._batches = batches(dataset, cfg)  # a generator: creating it draws nothing
        self._ahead: list[Batch] = []
        # DataLoader's shuffling draws from torch alone; so do the samples of a dataset without a random transform
        self._torch_only = isinstance(dataset, IndexedDataset) and dataset.needs_no_random_numbers
        self._per_draw = 1  # batches per RNG swap: one until the first batch's size is known

    def next(self) -> Batch:
        """The client's next mini-batch (the caller must not ask for more than `steps`)."""
        if self.drawn >= self.steps:
            raise RuntimeError(f"stream exhausted after {self.steps} batches")
        if not self._ahead:
            with self.rng.active(torch_only=self._torch_only):
                self._ahead = [next(self._batches) for _ in range(min(self._per_draw, self.steps - self.drawn))]
            self._ahead.reverse()
            size = sum(t.numel() * t.element_size() for t in self._ahead[-1])
            self._per_draw = max(1, min(AHEAD_MAX, AHEAD_BYTES // max(size, 1)))
        self.drawn += 1
        return self._ahead.pop()

