"""Each client's mini-batches, drawn exactly as the in-process runtime draws them.

In-process, a client's fit runs inside `seeded(seed, round, client, "fit")`, and `engine.local.batches`
shuffles (DataLoader's RandomSampler) and augments (torchvision transforms) from torch's global RNG, which
is also seeded from (seed, round, client). `ClientRng` seeds the global generators as `seeded` does at the
client's first block, saves where they got to and swaps them back in for every later draw of that client only, so
the batched runtime can interleave many clients' data streams and still give each client the very batches (order
AND augmentation) it would get in-process: the draws of one client happen in the same order against the same RNG,
and nothing else consumes that client's RNG (the batched step itself draws no random numbers: dropout is rejected,
see norm.py). A client's second pass (Ditto's personal model) continues the same RNG, as in-process.

A stream draws ahead: up to `AHEAD_BYTES` of a client's next batches in one swap of its RNG and, for an in-memory
dataset, one read (swapping the global RNG state in and out, or reading, per batch costs more than a small
model's step). That is the same sequence of draws on the same RNG, so the batches are the same.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from fedhet.config import TrainConfig
from fedhet.core.batches import num_steps
from fedhet.core.protocols import SampleSet, num_samples
from fedhet.core.seeding import derive_seed
from fedhet.data.datasets import IndexedDataset
from fedhet.engine.batching import batches, pass_indices

Batch = tuple[torch.Tensor, torch.Tensor]
AHEAD_BYTES = 1 << 22  # per client: 4 MiB of batches drawn at once (at least one batch, at most AHEAD_MAX)
AHEAD_MAX = 64


class ClientRng:
    """The global RNG states (torch CPU, numpy, random) of one client's `seeded(seed, rnd, cid, "fit")` block,
    resumable: `active()` swaps them in for a block and saves where they got to. Until a generator is first used
    its state is only the seed: entering a block seeds the global generator directly (what `seeded` does), which
    costs far less than building and copying a numpy / Python state per client (~0.15 ms)."""

    def __init__(self, seed: int, rnd: int, client_id: int, purpose: str = "fit") -> None:
        self._value = derive_seed(seed, rnd, client_id, purpose)
        self._torch: torch.Tensor | None = None  # None: still the seeded state
        self._numpy: Any = None  # Any: np.random.get_state()'s result (a dict or a tuple in numpy's stubs)
        self._python: Any = None  # Any: random.getstate()'s tuple[Any, ...]

    @staticmethod
    def _capture() -> tuple[torch.Tensor, Any, Any]:  # Any: numpy's and random's RNG states, loosely typed
        return torch.get_rng_state(), np.random.get_state(), random.getstate()

    @staticmethod
    def _restore(state: tuple[torch.Tensor, Any, Any]) -> None:  # Any: as _capture's
        torch.set_rng_state(state[0])
        np.random.set_state(state[1])
        random.setstate(state[2])

    def _enter_torch(self) -> None:
        if self._torch is None:
            torch.default_generator.manual_seed(self._value)
        else:
            torch.set_rng_state(self._torch)

    def _enter_all(self) -> None:
        self._enter_torch()
        if self._numpy is None:
            np.random.seed(self._value % 2**32)
            random.seed(self._value)
        else:
            np.random.set_state(self._numpy)
            random.setstate(self._python)

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
    def active(self, torch_only: bool = False, last: bool = False) -> Iterator[None]:
        """Run the block on this client's RNG; the caller's global RNG state is restored afterwards (inside
        `one_after_another`, at its end). `torch_only`: the block draws from torch's RNG alone (the data draws of
        a dataset whose samples need no random numbers), so numpy's and Python's states are left where they are.
        `last`: no later block uses this client's RNG (its `finish`), so where it got to is not saved."""
        if torch_only:
            outer_torch = torch.get_rng_state()
            self._enter_torch()
            try:
                yield
            finally:
                self._torch = torch.get_rng_state()
                torch.set_rng_state(outer_torch)
            return
        outer = None if _SHARED_OUTER else self._capture()
        self._enter_all()
        try:
            yield
        finally:
            if not last:
                self._torch, self._numpy, self._python = self._capture()
            if outer is not None:
                self._restore(outer)


_SHARED_OUTER = False  # inside ClientRng.one_after_another


class BatchStream:
    """One pass of `engine.local.batches(dataset, cfg)` for one client, drawn lazily on the client's RNG.

    An in-memory dataset whose samples need no random numbers is read in whole runs of batches: the pass's index
    batches are drawn (`engine.batching.pass_indices`, the same draws), and up to `AHEAD_BYTES` of them are read
    with one `IndexedDataset.batch` and split, the same values as a read per batch."""

    def __init__(self, rng: ClientRng, dataset: SampleSet, cfg: TrainConfig) -> None:
        self.rng = rng
        self.steps = num_steps(num_samples(dataset), cfg)
        self.drawn = 0
        self._ahead: list[Batch] = []
        self._per_draw = 1  # batches per read (per RNG swap): one until the first batch's size is known
        self._indexed = dataset if isinstance(dataset, IndexedDataset) and dataset.needs_no_random_numbers else None
        self._cfg = cfg
        self._indices: list[torch.Tensor] = []
        self._batches = None if self._indexed else batches(dataset, cfg)  # a generator: creating it draws nothing
        if self._indexed is not None and len(self._indexed):  # a batch's size, as float32 at least, known up front
            sample = self._indexed.parts[0].x[0]
            self._per_draw = self._batches_per_draw(min(cfg.batch_size, len(self._indexed))
                                                    * (sample.numel() * max(sample.element_size(), 4) + 8))

    def next(self) -> Batch:
        """The client's next mini-batch (the caller must not ask for more than `steps`)."""
        if self.drawn >= self.steps:
            raise RuntimeError(f"stream exhausted after {self.steps} batches")
        if not self._ahead:
            self._ahead = self._read(min(self._per_draw, self.steps - self.drawn))
            self._ahead.reverse()
            self._per_draw = self._batches_per_draw(sum(t.numel() * t.element_size() for t in self._ahead[-1]))
        self.drawn += 1
        return self._ahead.pop()

    @staticmethod
    def _batches_per_draw(batch_bytes: int) -> int:
        return max(1, min(AHEAD_MAX, AHEAD_BYTES // max(batch_bytes, 1)))

    def _read(self, count: int) -> list[Batch]:
        """The next `count` batches."""
        if self._indexed is None:
            assert self._batches is not None
            with self.rng.active():
                return [next(self._batches) for _ in range(count)]
        if self.drawn == 0:  # the first read draws the whole pass's index batches
            with self.rng.active(torch_only=True):
                self._indices = list(pass_indices(len(self._indexed), self._cfg))
            self._indices.reverse()
        wanted = [self._indices.pop() for _ in range(count)]
        x, y = self._indexed.batch(torch.cat(wanted))
        sizes = [i.shape[0] for i in wanted]
        return list(zip(x.split(sizes), y.split(sizes), strict=True))
