"""Client sampling: a seeded fraction of clients per round."""

from __future__ import annotations

import math

from fedhet.core.seeding import numpy_rng


def sample_size(num_clients: int, fraction: float, minimum: int = 1) -> int:
    """How many clients train per round: all when fraction >= 1, else ceil(fraction * N), at least `minimum`, at
    most N."""
    return num_clients if fraction >= 1.0 else min(num_clients, max(minimum, math.ceil(fraction * num_clients)))


def sample_clients(seed: int, rnd: int, num_clients: int, fraction: float, minimum: int = 1) -> list[int]:
    """Sorted ids of the clients that train in round `rnd` (all of them when fraction == 1)."""
    if fraction >= 1.0:
        return list(range(num_clients))
    k = sample_size(num_clients, fraction, minimum)
    chosen = numpy_rng(seed, "sample", rnd).choice(num_clients, size=k, replace=False)
    return sorted(int(c) for c in chosen)
