"""Client sampling: a seeded fraction of clients per round."""

from __future__ import annotations

import math

from fedhet.core.seeding import numpy_rng


def sample_clients(seed: int, rnd: int, num_clients: int, fraction: float, minimum: int = 1) -> list[int]:
    """Sorted ids of the clients that train in round `rnd` (all of them when fraction == 1)."""
    if fraction >= 1.0:
        return list(range(num_clients))
    k = min(num_clients, max(minimum, math.ceil(fraction * num_clients)))
    chosen = numpy_rng(seed, "sample", rnd).choice(num_clients, size=k, replace=False)
    return sorted(int(c) for c in chosen)
