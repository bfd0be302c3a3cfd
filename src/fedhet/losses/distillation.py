"""Mutual knowledge distillation of FedDAT (Chen et al., AAAI 2024, Eqs. 5-7; spec feddat.md §2.4) and the two
schedules its local training uses (App. B.2).

    L^s   = CE(z_s, y)   + alpha(t) * KL(z_s || z_DAT)        (trains the shared adapter A_s)
    L^DAT = CE(z_DAT, y) + beta(t)  * KL(z_DAT || z_s)        (trains the client adapter A_c)
    alpha(t) = beta(t) = exp(-5 (1 - t / T_0))                 (the ramp-up, App. B.2 Eq. 2)

The target gets no gradient (each loss updates only its own module, Alg. 1). Two directions (`kl_term`):
"official" (the official code's `kl_loss(output, target)` = F.kl_div(log p_output, p_target), i.e.
KL(p_target || p_trained): KL(p_DAT || p_s) for A_s; HaokunChen245/FedDAT src/train/visionlanguage_tasks/
task_trainer.py lines 506-516, called at 300 and 320) and "printed" (Eq. 5 as printed, KL(p_trained || p_target):
`kl_to_target`). Both are softmax distributions of the logits at `temperature` (the paper: 1, not stated; the
official code: 3, with the KL scaled by T^2). The CE of Eq. 6 is printed without its minus sign; it is the standard
cross-entropy here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def kl_to_target(trained: Tensor, target: Tensor, temperature: float = 1.0, scale_t2: bool = False,
                 grad_into: str = "trained") -> Tensor:
    """KL(softmax(trained / T) || softmax(target / T)), batch mean, gradient only into `trained` (Eq. 5 as printed:
    KL(z_s || z_DAT) for A_s; `grad_into="target"`: only into the second argument). `scale_t2` multiplies by T^2
    (Hinton et al.; the official code)."""
    trained = trained if grad_into == "trained" else trained.detach()
    target = target.detach() if grad_into == "trained" else target
    log_p = F.log_softmax(trained / temperature, dim=-1)
    log_q = F.log_softmax(target / temperature, dim=-1)
    outside = ~torch.isfinite(log_p)  # classes masked to -inf (a client's answer pool): probability 0, no term
    log_p, log_q = log_p.masked_fill(outside, 0.0), log_q.masked_fill(outside, 0.0)
    kl = (log_p.exp().masked_fill(outside, 0.0) * (log_p - log_q)).sum(-1).mean()
    return kl * temperature**2 if scale_t2 else kl


def kl_from_target(trained: Tensor, target: Tensor, temperature: float = 1.0, scale_t2: bool = False) -> Tensor:
    """KL(softmax(target / T) || softmax(trained / T)), batch mean, gradient only into `trained`: the official
    code's kl_loss(trained, target) (task_trainer.py 506-516), the usual distillation direction."""
    return kl_to_target(target.detach(), trained, temperature, scale_t2, grad_into="target")


KL_DIRECTIONS = ("official", "printed")


def kl_term(trained: Tensor, target: Tensor, direction: str, temperature: float = 1.0,
            scale_t2: bool = False) -> Tensor:
    """The mutual-distillation KL of `trained` towards the fixed `target` in `direction` (module doc)."""
    if direction == "official":
        return kl_from_target(trained, target, temperature, scale_t2)
    return kl_to_target(trained, target, temperature, scale_t2)


def exp_rampup(t: int, total: int) -> float:
    """alpha = beta = exp(-5 (1 - t / T_0)) at step t of T_0 (App. B.2); 1 from t >= T_0 on (T_0 <= 0: 1)."""
    if total <= 0:
        return 1.0
    return math.exp(-5.0 * (1.0 - min(t / total, 1.0)))


def warmup_linear_decay(t: int, total: int, warmup: float = 0.1) -> float:
    """The LR factor at optimizer step t (0-based) of `total`: linear warm-up over the first `warmup` share of the
    steps, then linear decay to 0 (App. B.2). The same factors as transformers' get_linear_schedule_with_warmup,
    which the official code uses: t / W while t < W, then (total - t) / (total - W), W = int(warmup * total)."""
    if total <= 0:
        return 1.0
    ramp = int(warmup * total)
    if t < ramp:
        return t / ramp
    return max(0.0, (total - t) / max(total - ramp, 1))
