"""FRAug's losses, schedules and draws (Chen et al., ICCV 2023), as plain functions of tensors.

- `synthetic_loss`: L_syn of Eq. (2) on the embeddings of Eq. (3), every input detached (reaches the head only).
- `generator_loss`: L_gen = CE(h(v_hat), y) - alpha * MMD(v_hat, u)                                       (Eq. 5)
- `rtnet_loss`:     L_rt  = -Ent(h(u_hat)) - sum_c Ent(h(u_hat_c)) + beta (MMD(u_hat, u) + sum_c MMD(u_hat_c, u_bar_c))
                                                                                                            (Eq. 6)
- `mmd_bandwidth`: the Gaussian-kernel bandwidth of every MMD in one local step (`Params.mmd_bandwidth`).
- `proto_labels`: the classes c of the B_syn prototype-based synthetic embeddings u_hat_c of one step.
- `lambda_c`, `lambda_syn` (appendix A.2 schedules), `update_prototypes` (Eq. 4).
- `pick_real`, `rt_source_c`: the RTNet's input for u_hat_c in the ablation without the generator.
- `residual`, `features_keep_bn`, `step_diagnostics`: a step's residuals, its recomputed stage-2 features and
  what it reports.

The sums over classes are reduced by `per_class`: per-class means, then summed (the literal Sigma_c) or averaged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.losses import gaussian_mmd, median_heuristic_sigma, softmax_entropy
from fedhet.models import SplitModel

BANDWIDTHS = ("pooled", "real", "fixed")
LABEL_DRAWS = ("rotate", "random")
RT_INPUTS_C = ("batch", "prototype")


def lambda_c(rnd: int, rounds: int, lambda0: float = 0.3, r0_frac: float = 0.05) -> float:
    """EMA ratio of the prototypes: exponential ramp-up to lambda0 over the first r0 = r0_frac * R rounds."""
    r0 = r0_frac * rounds
    return lambda0 * math.exp(-5.0 * (1.0 - rnd / r0)) if rnd < r0 else lambda0


def lambda_syn(rnd: int, rounds: int, rate: float = 0.01) -> float:
    """Weight of the generated residuals: exp(rate * (r - R)), reaching 1 at the last round."""
    return math.exp(rate * (rnd - rounds))


def update_prototypes(protos: torch.Tensor, seen: torch.Tensor, u: torch.Tensor, y: torch.Tensor, lam: float,
                      eps: float = 1e-6, skip_absent: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (4) on a batch (u detached): new (prototypes C x d, seen flags C). A class seen for the first time
    takes its batch mean; absent classes keep their prototype (`skip_absent`) or decay towards 0 (literal)."""
    onehot = F.one_hot(y, protos.shape[0]).to(u.dtype)
    sums, counts = onehot.T @ u, onehot.sum(0)
    present = counts > 0
    means = torch.where(present[:, None], sums / (counts + eps).clamp_min(1e-12)[:, None], 0.0)
    new = (1 - lam) * protos + lam * means
    new = torch.where((present & ~seen)[:, None], sums / counts.clamp_min(1)[:, None], new)
    update = present | (seen & (not skip_absent))
    return torch.where(update[:, None], new, protos), seen | present


def per_class(values: Tensor, labels: Tensor, num_classes: int, how: str = "mean") -> Tensor:
    """Per-class means of per-sample values, summed (Sigma_c of Eqs. 2 / 6) or averaged over the present classes."""
    sums = torch.zeros(num_classes, dtype=values.dtype, device=values.device).index_add(0, labels, values)
    counts = torch.bincount(labels, minlength=num_classes)
    means = sums[counts > 0] / counts[counts > 0]
    return means.sum() if how == "sum" else means.mean()


def proto_labels(classes: Tensor, b_syn: int, per_class_draw: bool, draw: str, cursor: int) -> tuple[Tensor, int]:
    """(labels c of this step's u_hat_c, the next cursor) over `classes` (the classes with a prototype).

    `b_syn` labels in total: `rotate` deals them round-robin, continuing where the previous step stopped (the
    `cursor`), so every class gets ceil or floor of b_syn * steps / C terms; `random` draws them uniformly with
    replacement (torch's global RNG). `per_class_draw`: b_syn labels of every class instead."""
    n = len(classes)
    if not n:
        return classes, cursor
    if per_class_draw:
        return classes.repeat_interleave(b_syn), cursor
    if draw == "random":
        return classes[torch.randint(n, (b_syn,), device=classes.device)], cursor
    idx = (cursor + torch.arange(b_syn, device=classes.device)) % n
    return classes[idx], (cursor + b_syn) % n


def pick_real(y: Tensor, labels_c: Tensor, from_batch: bool) -> Tensor:
    """For each label c of labels_c, the index of a random real sample of class c in the batch (torch's global
    RNG), or -1 when the batch has none (or `from_batch` is false): then the prototype u_bar_c is used."""
    if not from_batch or not len(labels_c):
        return torch.full((len(labels_c),), -1, dtype=torch.long, device=y.device)
    match = labels_c[:, None] == y[None]
    scores = torch.rand(match.shape, device=y.device).masked_fill(~match, -1.0)
    return torch.where(match.any(1), scores.argmax(1), -1)


def rt_source_c(u: Tensor, protos: Tensor, labels_c: Tensor, pick: Tensor) -> Tensor:
    """The RTNet's input for u_hat_c without the generator: the picked real embedding u_i, else u_bar_c."""
    real = u.detach()[pick.clamp_min(0)]
    return torch.where((pick >= 0)[:, None], real, protos.detach()[labels_c])


def mmd_bandwidth(u: Tensor, how: str, sigma: float | None) -> Tensor | None:
    """The bandwidth of every MMD of a step: `real` = median distance among the real embeddings u (detached),
    `fixed` = `sigma`, `pooled` = None (median over each MMD's own pooled sample, scale-invariant)."""
    if how == "fixed":
        if sigma is None:
            raise ValueError("mmd_bandwidth 'fixed' needs mmd_sigma")
        return torch.as_tensor(sigma, dtype=u.dtype, device=u.device)
    if how == "real":
        return median_heuristic_sigma(u, u[:0])
    return None


def synthetic_loss(head: nn.Module, u: Tensor, y: Tensor, res: Tensor, protos: Tensor, labels_c: Tensor,
                   res_c: Tensor | None, lam_syn: float, num_classes: int, reduction: str) -> Tensor:
    """Eqs. (2)-(3): CE(h(u + lam res), y) + Sigma_c CE(h(u_bar_c + lam res_c), c), every input detached."""
    loss = F.cross_entropy(head(u.detach() + lam_syn * res.detach()), y)
    if res_c is not None and len(labels_c):
        u_hat_c = protos.detach()[labels_c] + lam_syn * res_c.detach()
        ce = F.cross_entropy(head(u_hat_c), labels_c, reduction="none")
        loss = loss + per_class(ce, labels_c, num_classes, reduction)
    return loss


def generator_loss(head: nn.Module, v: Tensor, y: Tensor, u: Tensor, alpha: float, sigma: Tensor | None) -> Tensor:
    """Eq. (5): CE(h(v_hat), y) - alpha * MMD(v_hat, u); u is the real embeddings of the batch."""
    return F.cross_entropy(head(v), y) - alpha * gaussian_mmd(v, u.detach(), sigma)


def rtnet_loss(head: nn.Module, u: Tensor, y: Tensor, u_hat: Tensor, protos: Tensor, labels_c: Tensor,
               u_hat_c: Tensor | None, beta: float, sigma: Tensor | None, proto_mmd: str = "prototype",
               reduction: str = "mean") -> Tensor:
    """Eq. (6): -Ent(h(u_hat)) - Sigma_c Ent(h(u_hat_c)) + beta (MMD(u_hat, u) + Sigma_c MMD(u_hat_c, u_bar_c)).

    The class-c MMD compares with the prototype as a one-sample set, or (`proto_mmd="real"`) with the batch's
    real class-c embeddings when it has any."""
    u = u.detach()
    loss = -softmax_entropy(head(u_hat)) + beta * gaussian_mmd(u_hat, u, sigma)
    if u_hat_c is None or not len(labels_c):
        return loss
    logits_c, terms = head(u_hat_c), []
    for c in torch.unique(labels_c):
        mask = labels_c == c
        real = u[y == c] if proto_mmd == "real" else u[:0]
        target = real if len(real) else protos[c].detach()[None]
        terms.append(-softmax_entropy(logits_c[mask]) + beta * gaussian_mmd(u_hat_c[mask], target, sigma))
    total = torch.stack(terms)
    return loss + (total.sum() if reduction == "sum" else total.mean())


def residual(gen: nn.Module | None, rt: nn.Module | None, z: Tensor | None, y: Tensor, base: Tensor | None
             ) -> Tensor:
    """m(g(z, y)); g(z, y) without the RTNet; m(base) without the generator (base: u, or u_hat_c's source)."""
    if gen is not None:
        v: Tensor = gen(z, y)
    elif base is not None:
        v = base.detach()
    else:
        raise ValueError("fraug: a residual without the generator needs the RTNet's input")
    return v if rt is None else rt(v.detach())


@torch.no_grad()
def features_keep_bn(model: SplitModel, x: Tensor) -> Tensor:
    """f(x) in train mode with the BatchNorm running statistics restored afterwards."""
    saved = [b.clone() for b in model.buffers()]
    u: Tensor = model.features(x)
    for b, s in zip(model.buffers(), saved, strict=True):
        b.copy_(s)
    return u


@torch.no_grad()
def step_diagnostics(gen_loss: Tensor, rt_loss: Tensor, u: Tensor, res: Tensor, sigma: Tensor | None) -> Tensor:
    """A stage-2 step's diagnostics (fraug.DIAGNOSTICS): the two losses, the unweighted MMD(u + res, u), the mean
    norms of the residual and of u, and the MMD's bandwidth."""
    s = median_heuristic_sigma(u + res, u) if sigma is None else sigma
    mmd = gaussian_mmd(u + res, u, s)
    norms = res.norm(dim=1).mean(), u.norm(dim=1).mean()
    return torch.stack([gen_loss.detach(), rt_loss.detach(), mmd, *norms, s.reshape(())]).float().cpu()
