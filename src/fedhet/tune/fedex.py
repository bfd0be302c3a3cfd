"""FedEx (Khodak et al., NeurIPS 2021), the local-HP baseline FedPop is compared with (spec fedpop.md §2.8),
after the authors' code (mkhodak/FedEx `hyper.py`); *faithful in spirit*: its weight-sharing idea and update
rule on fedhet's clients, not a port.

Each configuration (member) holds n candidate local vectors (FedPop's comparison: 27 per tuning process, drawn
from the client search space's own distribution, as FedEx samples its configs) and a categorical distribution
theta over them, kept as z = log theta. Every round each active client draws its candidate from theta, trains,
and reports its validation error after local training; theta then takes one exponentiated-gradient step:

    grad_j = sum_k w_k (e_k - b) 1[c_k = j] / theta_j,   z <- z - eta * grad,   z <- z - logsumexp(z)

with w_k the clients' validation-set shares, b the baseline (the previous round's weighted error: the code's
default discount 0.0) and eta = sqrt(2 log n) / sqrt(t) (the code's `eta0='auto'`, `sched='auto'`). The member's
beta^0 (what it deploys, finetunes with and reports) is the most likely candidate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedhet.tune.space import HPVector, Space

CANDIDATES = 27  # "27 additional beta" per tuning process (spec §2.8)


@dataclass
class FedExState:
    """One member's candidates, log-probabilities z, step count t and the previous weighted error (baseline)."""

    candidates: list[HPVector] = field(default_factory=list)
    z: list[float] = field(default_factory=list)
    steps: int = 0
    baseline: float | None = None

    @property
    def theta(self) -> np.ndarray:
        return np.exp(np.asarray(self.z, dtype=np.float64))

    def mle(self) -> HPVector:
        """The most likely candidate (ties: the first)."""
        return dict(self.candidates[int(np.argmax(self.z))])


def fedex_start(space: Space, rng: np.random.Generator, n: int = CANDIDATES) -> FedExState:
    """n candidates drawn from the client space's distribution and a uniform theta."""
    return FedExState(candidates=[space.sample(rng) for _ in range(n)], z=[-math.log(n)] * n)


def fedex_draw(state: FedExState, k: int, rng: np.random.Generator) -> list[int]:
    """The candidate index of each of the round's k active clients, drawn from theta."""
    theta = state.theta
    return [int(i) for i in rng.choice(len(theta), size=k, p=theta / theta.sum())]


def fedex_step(state: FedExState, chosen: Sequence[int], errors: Sequence[float],
               weights: Sequence[float]) -> FedExState:
    """One exponentiated-gradient step on theta from the active clients' validation errors (module docstring)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    e = np.asarray(errors, dtype=np.float64)
    baseline = 0.0 if state.baseline is None else state.baseline
    theta, z = state.theta, np.asarray(state.z, dtype=np.float64)
    grad = np.zeros_like(z)
    for j, err, wk in zip(chosen, e, w, strict=True):
        grad[j] += wk * (err - baseline) / theta[j]
    steps = state.steps + 1
    eta = math.sqrt(2.0 * math.log(len(z))) / math.sqrt(steps) if len(z) > 1 else 0.0
    z = z - eta * grad
    z = z - np.logaddexp.reduce(z)
    return FedExState(candidates=state.candidates, z=[float(v) for v in z], steps=steps,
                      baseline=float(np.inner(e, w)))
