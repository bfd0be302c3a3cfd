"""When to re-fit an adaptive MMD kernel during local training (Ditto-MMD §4; spec ditto_mmd.md §2.3-2.4).

Usage by a client (step = local step index counted from 0 within the client's local training):

    sched = KernelWeightSchedule(interval=20, n_accumulate=50)     # MK-MMD_20 / periodic MMD-D
    for step, (xb, yb) in enumerate(batches):
        if sched.per_step:                       # interval -1 (MK-MMD_-1): re-fit on this batch's features
            mmd.fit_weights(f_local(xb).detach(), f_global(xb))
        elif sched.refit_due(step):              # steps 0, 20, 40, ... (FL4Health: 1, 21, 41, 1-based)
            xs, ys = features of the local (eval, no grad) and frozen global model over
                     `sched.n_accumulate` training batches, concatenated
            mmd.fit_weights(xs, ys)              # MMD-D: mmd.train_steps(xs, ys, n_steps)
        loss = ce + mu * mmd(f_local(xb), f_global(xb))

interval 0 means never re-fit (the fixed-kernel ablation). Accumulating features needs the models and the data
loader, so it stays with the caller.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelWeightSchedule:
    """interval: -1 = every step on the current batch, 0 = never, k > 0 = every k steps on N_b accumulated batches."""

    interval: int = 20
    n_accumulate: int = 50

    def __post_init__(self) -> None:
        if self.interval < -1:
            raise ValueError(f"interval must be -1, 0 or positive, got {self.interval}")
        if self.n_accumulate < 1:
            raise ValueError(f"n_accumulate must be >= 1, got {self.n_accumulate}")

    @property
    def per_step(self) -> bool:
        """True for interval -1: re-fit before every step on that step's batch."""
        return self.interval == -1

    def refit_due(self, step: int) -> bool:
        """Whether to re-fit before local step `step` (0-based)."""
        if self.interval == -1:
            return True
        return self.interval > 0 and step % self.interval == 0
