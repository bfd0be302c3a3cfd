"""Evo (FedPop Eq. 3, spec §2.3), its cosine annealing (Eq. 4 / appendix Eqs. 3-4, spec §2.4) and the Delta-ball
sampling of the K local client vectors around beta^0 (spec §2.2). All on positions (`fedhet.tune.space`): log10
for log-scaled kinds, the grid index for discrete ones. Every random draw comes from the `numpy.random.Generator`
passed in, coordinate by coordinate in the space's order, so the same seed gives the same vectors.

Where the paper is silent (spec §2.3, §7.3), these are our choices, each a switch in `EvoOptions`:

* `boundary="clip"`: a perturbed continuous coordinate is clipped to [a_j, b_j] (the paper does not say; left
  outside, values can leave the config's valid range, e.g. momentum >= 1); `"reflect"` mirrors it back inside
  instead, which puts no probability mass on the bound itself.
* `paper_floor=False`: a discrete step is k = max(1, floor(delta_j)) when delta_j > 0, with delta_j measured on
  the index range (b_j - a_j = n - 1); the paper-literal k = floor(delta_j) is 0 for eps0 = 0.1 and n <= 10, so
  discrete values would move only by resampling. delta_j = 0 (eps annealed to 0) keeps the value either way.
* A neighbour index outside the grid is dropped from {i - k, i, i + k}; the new index is uniform over the rest
  (so at an end of the grid: stay or move inward, 1/2 each).

Resampling (p_re) draws the coordinate from its original distribution H_j instead of perturbing it. FedPop-L's
"restrict the perturbed HP-vector to lie inside a Delta-ball" is `project_to_ball`: per-coordinate clipping to
the same box `delta_ball` samples from (the appendix defines the ball per coordinate, not as an L2 ball).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedhet.errors import ConfigError
from fedhet.tune.space import Dim, HPVector, Space

EPS0 = 0.1  # initial perturbation intensity epsilon_0 (spec §2.10)
P_RE0 = 0.1  # initial resampling probability p_re^0 (spec §2.10)
BALL_RADIUS = 0.2  # Delta-ball half-width, as a share of (b - a), for continuous HPs (spec §2.2)


@dataclass(frozen=True)
class EvoOptions:
    """Switches for the details Eq. 3 leaves open (module doc)."""

    boundary: str = "clip"  # a perturbed continuous coordinate past [a, b]: clip to it | reflect back into it
    paper_floor: bool = False  # discrete step k = floor(delta) (paper-literal) instead of max(1, floor(delta))

    def __post_init__(self) -> None:
        if self.boundary not in ("clip", "reflect"):
            raise ConfigError(f"Evo boundary must be 'clip' or 'reflect', got {self.boundary!r}")


def anneal(x0: float, r: float, r0: float) -> float:
    """x_r = (x0 / 2)(1 + cos(pi r / r0)) for r < r0, else 0 (appendix Eqs. 3-4): for eps and p_re.

    r counts rounds (for FedPop-L, since the member's last (re)initialisation, r0 = 0.2 T_g; for FedPop-G and
    p_re, r0 = R_c).
    """
    if r < 0:
        raise ValueError(f"anneal: round r must be >= 0, got {r}")
    if r >= r0:
        return 0.0
    return x0 / 2.0 * (1.0 + math.cos(math.pi * r / r0))


def delta(dim: Dim, eps: float) -> float:
    """delta_j = (b_j - a_j) * eps * scale_j (Eq. 3); on the index range for a discrete dimension."""
    return dim.width * eps * dim.scale


def discrete_step(dim: Dim, eps: float, options: EvoOptions = EvoOptions()) -> int:
    """k in {x^{i-k}, x^i, x^{i+k}}: floor(delta), at least 1 unless `paper_floor` or delta = 0."""
    d = delta(dim, eps)
    k = math.floor(d)
    return k if options.paper_floor or d <= 0 else max(1, k)


def _neighbour(dim: Dim, index: int, k: int, rng: np.random.Generator) -> int:
    """Uniform over {index - k, index, index + k}, less the indices off the grid."""
    candidates = [i for i in (index - k, index, index + k) if 0 <= i < len(dim.grid)]
    return candidates[int(rng.integers(len(candidates)))]


def perturb(dim: Dim, pos: float, eps: float, rng: np.random.Generator,
            options: EvoOptions = EvoOptions()) -> float:
    """One coordinate of Eq. 3 without resampling: U(h - delta, h + delta), brought back into [a, b] by
    `options.boundary`, or a neighbour move by `discrete_step` on the grid."""
    if dim.discrete:
        return _neighbour(dim, int(pos), discrete_step(dim, eps, options), rng)
    d = delta(dim, eps)
    new = float(rng.uniform(pos - d, pos + d))
    if options.boundary == "reflect":  # mirror at the bound (delta <= b - a, so once is enough)
        new = 2 * dim.low - new if new < dim.low else 2 * dim.high - new if new > dim.high else new
    return min(max(new, dim.low), dim.high)


def evo(space: Space, vec: Mapping[str, float], eps: float, p_re: float, rng: np.random.Generator,
        options: EvoOptions = EvoOptions()) -> HPVector:
    """Evo(h) (Eq. 3): each coordinate resampled from H_j with probability p_re, else perturbed by `perturb`.

    For FedPop-G pass the joint space and Concat(alpha, beta^0); for FedPop-L the client space and beta^k.
    """
    space.check(vec)
    out: HPVector = {}
    for key, dim in space.dims.items():
        resample = rng.random() < p_re  # drawn for every coordinate, so p_re never shifts the random stream
        out[key] = dim.sample(rng) if resample else perturb(dim, vec[key], eps, rng, options)
    return out


def _ball(dim: Dim, center: float, radius: float) -> tuple[float, float]:
    """The Delta-ball's extent on one coordinate: neighbouring indices, or +-radius (b - a), inside [a, b]."""
    half = 1.0 if dim.discrete else radius * dim.width
    return max(dim.low, center - half), min(dim.high, center + half)


def delta_ball(space: Space, center: Mapping[str, float], k: int, rng: np.random.Generator,
               radius: float = BALL_RADIUS) -> list[HPVector]:
    """K local client vectors beta^1..beta^K inside the Delta-ball around beta^0 (spec §2.2): a discrete
    coordinate is one of its neighbouring values {x_{j-1}, x_j, x_{j+1}} (those on the grid), a continuous one
    is uniform in [x - radius (b - a), x + radius (b - a)] clipped to [a, b]."""
    space.check(center)
    if k < 1:
        raise ValueError(f"delta_ball: need k >= 1 vectors, got {k}")
    vectors = []
    for _ in range(k):
        vec: HPVector = {}
        for key, dim in space.dims.items():
            if dim.discrete:
                vec[key] = _neighbour(dim, int(center[key]), 1, rng)
            else:
                low, high = _ball(dim, center[key], radius)
                vec[key] = float(rng.uniform(low, high))
        vectors.append(vec)
    return vectors


def project_to_ball(space: Space, vec: Mapping[str, float], center: Mapping[str, float],
                    radius: float = BALL_RADIUS) -> HPVector:
    """`vec` clipped coordinate-wise into the Delta-ball around `center` (FedPop-L's restriction, spec §2.3)."""
    space.check(vec)
    space.check(center)
    out: HPVector = {}
    for key, dim in space.dims.items():
        low, high = _ball(dim, center[key], radius)
        clipped = min(max(vec[key], low), high)
        out[key] = int(clipped) if dim.discrete else clipped
    return out
