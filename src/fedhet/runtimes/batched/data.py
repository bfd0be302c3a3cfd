"""Each client's mini-batches, drawn exactly as the in-process runtime draws them.

In-process, a client's fit runs inside `seeded(seed, round, client, "fit")`, and `engine.local.batches`
shuffles (DataLoader's RandomSampler) and augments (torchvision transforms) from torch's global RNG, which
is also seeded from (seed, round, client). `ClientRng` captures that seeded RNG state once and swaps it in
for every draw of that client only, so the batched runtime can interleave many clients' data streams and
still give each client the very batches (order AND augmentation) it would get in-process: the draws of one
client happen in the same order against the same RNG, and nothing else consumes that client's RNG
(the batched step itself draws no random numbers: dropout is rejected, see norm.py). A client's second pass
(Ditto's personal model) continues the same RNG, as in-process.

Only one step's batch per client is in memory at a time.
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
from fedhet.core.seeding import seeded
from fedhet.engine.batching import batches

Batch = tuple[torch.Tensor, torch.Tensor]


class ClientRng:
    """The global RNG states (torch CPU, numpy, random) of one client's `seeded(seed, rnd, cid, "fit")` block,
    resumable: `active()` swaps them in for a block and saves where they got to."""

    def __init__(self, seed: int, rnd: int, client_id: int, purpose: str = "fit") -> None:
        with seeded(seed, rnd, client_id, purpose):
            self._state = self._capture()

    @staticmethod
    def _capture() -> tuple[torch.Tensor, Any, Any]:
        return torch.get_rng_state(), np.random.get_state(), random.getstate()

    @staticmethod
    def _restore(state: tuple[torch.Tensor, Any, Any]) -> None:
        torch.set_rng_state(state[0])
        np.random.set_state(state[1])
        random.setstate(state[2])

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the block on this client's RNG; the caller's global RNG state is restored afterwards."""
        outer = self._capture()
        self._restore(self._state)
        try:
            yield
        finally:
            self._state = self._capture()
            self._restore(outer)


class BatchStream:
    """One pass of `engine.local.batches(dataset, cfg)` for one client, drawn lazily on the client's RNG."""

    def __init__(self, rng: ClientRng, dataset: Dataset, cfg: TrainConfig) -> None:
        self.rng = rng
        self.steps = num_steps(len(dataset), cfg)  # type: ignore[arg-type]
        self.drawn = 0
        self._batches = batches(dataset, cfg)  # a generator: creating it draws nothing

    def next(self) -> Batch:
        """The client's next mini-batch (the caller must not ask for more than `steps`)."""
        if self.drawn >= self.steps:
            raise RuntimeError(f"stream exhausted after {self.steps} batches")
        with self.rng.active():
            batch = next(self._batches)
        self.drawn += 1
        return batch

