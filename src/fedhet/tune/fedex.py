"""FedEx (Khodak et al., NeurIPS 2021), the local-HP baseline FedPop is compared with (spec fedpop.md §2.8),
after the authors' code (mkhodak/FedEx `hyper.py`, `cifar.py`); *faithful in spirit*: its weight-sharing idea and
update rule on fedhet's clients, not a port. docs/tune.md lists paper vs official code vs fedhet.

Each configuration (member) holds n candidate local vectors and a categorical distribution theta over them, kept
as z = log theta. The candidates (`fedex_start`), as the official `get_client` (cifar.py lines 282-317) builds
them: the member's beta^0 itself and n - 1 perturbations of it, each continuous coordinate uniform in
h +- (b - a) eps (lr and weight decay +-4 eps on log10, mu +-5 eps, momentum +-eps: the code's ranges), each
discrete one a neighbour (Evo's `perturb`, p_re = 0); FedPop's "narrower HP search space". `mode="space"` draws all
n from the client space instead (fedhet before issue 37). Every round each active client draws its candidate from
theta, trains, and reports its validation error after local training; theta then takes one step:

    grad_j = sum_k w_k (e_k - b) 1[c_k = j] / theta_j,   z <- z - eta * grad,   z <- z - logsumexp(z)

with w_k the clients' validation-set shares and b the baseline: the `discount`-discounted mean of the earlier
rounds' weighted errors (hyper.py lines 137-143; 0 in the first round; discount 0 = the last round's error), the
discount drawn U[0, 1) per member unless given (cifar.py line 82 `--baseline -1.0`, hyper.py line 592).
eta = eta0 / max_j |grad_j| (`sched="aggressive"`, cifar.py line 79 and hyper.py line 538's default; hyper.py
lines 158-159) or eta0 / sqrt(t) (`"auto"`), eta0 = sqrt(2 log n). The member's beta^0 (what it deploys, finetunes
with and reports) is the most likely candidate (the code's `--mle`; its default samples one per client).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedhet.tune.evo import EvoOptions, perturb
from fedhet.tune.space import HPVector, Space

CANDIDATES = 27  # "27 additional beta" per tuning process (spec §2.8)
SCHEDS = ("aggressive", "auto")


@dataclass
class FedExState:
    """One member's candidates, log-probabilities z, step count t, the earlier rounds' weighted errors (`trace`),
    the baseline's discount and the step schedule."""

    candidates: list[HPVector] = field(default_factory=list)
    z: list[float] = field(default_factory=list)
    steps: int = 0
    baseline: float | None = None  # the last round's weighted error (kept for the log)
    trace: list[float] = field(default_factory=list)
    discount: float = 0.0
    sched: str = "auto"  # a checkpoint from before issue 37 keeps its rule; fedex_start passes tune.fedex_sched

    @property
    def theta(self) -> np.ndarray:
        return np.exp(np.asarray(self.z, dtype=np.float64))

    def mle(self) -> HPVector:
        """The most likely candidate (ties: the first)."""
        return dict(self.candidates[int(np.argmax(self.z))])


def candidates_around(space: Space, beta0: HPVector, n: int, eps: float, rng: np.random.Generator) -> list[HPVector]:
    """beta^0 and n - 1 perturbations of it (Evo's `perturb` on every coordinate, no resampling)."""
    space.check(beta0)
    return [dict(beta0)] + [{key: perturb(dim, beta0[key], eps, rng, EvoOptions()) for key, dim in space.dims.items()}
                            for _ in range(n - 1)]


def fedex_start(space: Space, rng: np.random.Generator, n: int = CANDIDATES, *, beta0: HPVector | None = None,
                eps: float = 0.1, mode: str = "perturb", discount: float | None = None,
                sched: str = "aggressive") -> FedExState:
    """n candidates (module docstring: around `beta0`, or `mode="space"`: drawn from the space) and a uniform
    theta; the baseline's discount drawn U[0, 1) from `rng` when None."""
    if sched not in SCHEDS:
        raise ValueError(f"fedex_start: unknown sched {sched!r}; valid: {', '.join(SCHEDS)}")
    if mode == "perturb":
        if beta0 is None:
            raise ValueError("fedex_start: mode='perturb' builds the candidates around beta0; pass it")
        cands = candidates_around(space, beta0, n, eps, rng)
    elif mode == "space":
        cands = [space.sample(rng) for _ in range(n)]
    else:
        raise ValueError(f"fedex_start: unknown mode {mode!r}; valid: perturb, space")
    drawn = float(rng.uniform(0.0, 1.0)) if discount is None else float(discount)
    return FedExState(candidates=cands, z=[-math.log(n)] * n, discount=drawn, sched=sched)


def fedex_draw(state: FedExState, k: int, rng: np.random.Generator) -> list[int]:
    """The candidate index of each of the round's k active clients, drawn from theta."""
    theta = state.theta
    return [int(i) for i in rng.choice(len(theta), size=k, p=theta / theta.sum())]


def discounted_mean(trace: Sequence[float], factor: float) -> float:
    """sum_r factor^(R-r) trace_r / sum_r factor^(R-r), the newest weighted 1 (factor 0: the newest alone)."""
    weights = factor ** np.arange(len(trace) - 1, -1, -1, dtype=np.float64)
    return float(np.inner(np.asarray(trace, dtype=np.float64), weights) / weights.sum())


def fedex_step(state: FedExState, chosen: Sequence[int], errors: Sequence[float],
               weights: Sequence[float]) -> FedExState:
    """One exponentiated-gradient step on theta from the active clients' validation errors (module docstring)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    e = np.asarray(errors, dtype=np.float64)
    baseline = discounted_mean(state.trace, state.discount) if state.trace else 0.0
    theta, z = state.theta, np.asarray(state.z, dtype=np.float64)
    grad = np.zeros_like(z)
    for j, err, wk in zip(chosen, e, w, strict=True):
        grad[j] += wk * (err - baseline) / theta[j]
    steps = state.steps + 1
    eta0 = math.sqrt(2.0 * math.log(len(z))) if len(z) > 1 else 0.0
    top = float(np.abs(grad).max()) if grad.size else 0.0
    eta = eta0 / (math.sqrt(steps) if state.sched == "auto" else top if top > 0 else 1.0)
    z = z - eta * grad
    z = z - np.logaddexp.reduce(z)
    error = float(np.inner(e, w))
    return FedExState(candidates=state.candidates, z=[float(v) for v in z], steps=steps, baseline=error,
                      trace=[*state.trace, error], discount=state.discount, sched=state.sched)
