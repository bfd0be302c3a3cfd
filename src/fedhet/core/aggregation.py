"""Server-side aggregation: weighted / uniform averaging and the server optimizer (FedAvgM, FedAdam)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedhet.config import ServerConfig
from fedhet.core.params import StateDict


def average(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    """Weighted mean of state dicts (weights are normalised). Integer tensors (e.g. BN's
    num_batches_tracked) are averaged too and rounded back to their dtype.

    The sum runs in float64, client after client: each update is converted into one float64 buffer per key,
    reused for every client (it allocated two float64 temporaries per client and key: issue 42), scaled, and
    added; the same operations in the same order as `sum(s[k].double() * (w / total))`, so the same bits. A
    fused `acc.add_(update, alpha=w)` would skip the buffer but round once instead of twice (FMA), which changes
    the last bit of recorded results."""
    if not states:
        raise ValueError("nothing to average")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    out: StateDict = {}
    for key in states[0]:
        ref = states[0][key]
        acc = torch.zeros_like(ref, dtype=torch.float64)
        term = torch.empty_like(acc)
        for state, w in zip(states, weights, strict=True):
            acc += term.copy_(state[key]).mul_(w / total)
        out[key] = acc.round().to(ref.dtype) if not ref.is_floating_point() else acc.to(ref.dtype)
    return out


def client_weights(num_examples: Sequence[int], mode: str) -> list[float]:
    """Sample-count weights (`weighted`) or equal weights (`uniform`)."""
    if mode == "uniform":
        return [1.0] * len(num_examples)
    return [float(max(n, 0)) for n in num_examples]


class ServerOptimizer:
    """Applies the averaged update as a pseudo-gradient Δ = w − avg (Reddi et al. 2021, Alg. 2).

    sgd with lr=1, momentum=0 is plain FedAvg (w ← avg); momentum > 0 is FedAvgM; `adam` is FedAdam
    with tau = `eps`. `lr_decay` < 1 decays the server lr per step, lr_t = lr * lr_decay^(t-1) (StepLR with
    step 1, as the FedEx code's server). Non-float entries (buffer counters) are replaced by the average directly,
    and so are the model's `buffers` (BatchNorm running statistics) unless `server.optimize_buffers`: a torch
    optimizer over `model.parameters()` (FederatedScope's FedOpt, APPFL's FedAdam) never touches them, and a running
    variance stepped with lr > 1 or momentum can turn negative.
    """

    def __init__(self, cfg: ServerConfig, buffers: frozenset[str] = frozenset()) -> None:
        self.cfg = cfg
        self.buffers = buffers  # state keys of the model's buffers

    def is_identity(self) -> bool:
        return (self.cfg.optimizer == "sgd" and self.cfg.lr == 1.0 and self.cfg.momentum == 0.0
                and self.cfg.lr_decay == 1.0)

    def step(self, current: StateDict, averaged: StateDict, opt_state: dict[str, torch.Tensor | int]
             ) -> tuple[StateDict, dict[str, torch.Tensor | int]]:
        """New global state and new optimizer state (both plain dicts of tensors)."""
        if self.is_identity():
            return averaged, opt_state
        new, state = {}, dict(opt_state)
        t = int(state.get("t", 0)) + 1
        state["t"] = t
        lr = self.cfg.lr * self.cfg.lr_decay ** (t - 1)
        for key, avg in averaged.items():
            cur = current[key]
            if not cur.is_floating_point() or (key in self.buffers and not self.cfg.optimize_buffers):
                new[key] = avg
                continue
            delta = cur - avg  # pseudo-gradient
            if self.cfg.optimizer == "sgd":
                if self.cfg.momentum > 0:
                    buf = state.get(f"m/{key}")
                    buf = delta.clone() if buf is None else buf * self.cfg.momentum + delta
                    state[f"m/{key}"] = buf
                    delta = buf
                new[key] = cur - lr * delta
            else:
                b1, b2 = self.cfg.betas
                m = state.get(f"m/{key}", torch.zeros_like(cur)) * b1 + (1 - b1) * delta
                v = state.get(f"v/{key}", torch.zeros_like(cur)) * b2 + (1 - b2) * delta * delta
                state[f"m/{key}"], state[f"v/{key}"] = m, v
                new[key] = cur - lr * m / (v.sqrt() + self.cfg.eps)
        return new, state
