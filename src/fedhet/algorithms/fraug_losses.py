"""FRAug's losses, schedules and draws (Chen et al., ICCV 2023) as plain functions of tensors: Eqs. (2)-(6), the
appendix A.2 schedules, and the official code's variants (HaokunChen245/FRAug; docs/fraug.md, "Paper vs official
code vs fedhet"). Sums over classes are reduced by `per_class`: per-class means, then summed (the literal Sigma_c)
or averaged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.losses import gaussian_mmd, median_heuristic_sigma, softmax_entropy
from fedhet.losses.feature_distance import mean_cov_distance, multi_kernel_mmd
from fedhet.models import SplitModel

BANDWIDTHS = ("pooled", "real", "fixed")
LABEL_DRAWS = ("rotate", "random")
RT_INPUTS_C = ("batch", "prototype")
DISTANCES = ("mmd", "mmd_multi", "mean_cov", "l2")


def distance(kind: str, a: Tensor, b: Tensor, sigma: Tensor | None = None) -> Tensor:
    """d(a, b): `mmd` Gaussian MMD^2 (bandwidth `sigma`, None: pooled median), `mmd_multi` / `mean_cov` the official
    set distances (fedhet.losses.feature_distance), `l2` the mean squared error to the paired targets b (b is
    broadcast: one row = one target for all; official torch.nn.MSELoss, user_FRAug.py:83)."""
    if kind == "mmd":
        return gaussian_mmd(a, b, sigma)
    if kind == "mmd_multi":
        return multi_kernel_mmd(a, b)
    if kind == "mean_cov":
        return mean_cov_distance(a, b)
    if kind == "l2":
        return F.mse_loss(a, b.expand_as(a))
    raise ValueError(f"fraug: unknown distance {kind!r}; valid: {', '.join(DISTANCES)}")


def noise(n: int, dim: int, kind: str, device: torch.device) -> Tensor:
    """The generator's input noise: U[0, 1) (`uniform`, official torch.rand) or N(0, I) (`normal`, appendix)."""
    return torch.rand(n, dim, device=device) if kind == "uniform" else torch.randn(n, dim, device=device)


def mix_weight(rnd: int, rounds: int, rate: float) -> float:
    """The official stage-1 weight w of the synthetic CE: min(0.5, exp(rate (r - R))) (user_FRAug.py:113-119; the
    official round is 0-based, r - 1 here)."""
    return min(0.5, math.exp(rate * (rnd - 1 - rounds)))


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


def generator_loss(head: nn.Module, v: Tensor, y: Tensor, u: Tensor, alpha: float, sigma: Tensor | None,
                   kind: str = "mmd") -> Tensor:
    """Eq. (5): CE(h(v_hat), y) - alpha * d(v_hat, u); u: the real embeddings of the batch (or, for `l2`, the
    prototypes of y: user_FRAug.py:218-222)."""
    return F.cross_entropy(head(v), y) - alpha * distance(kind, v, u.detach(), sigma)


def rtnet_term(logits: Tensor, x: Tensor, target: Tensor, beta: float, sigma: Tensor | None, kind: str) -> Tensor:
    """One term of Eq. (6) (the official L_FT's branch): -Ent(h(x)) + beta d(x, target), `logits` = h(x)."""
    return -softmax_entropy(logits) + beta * distance(kind, x, target, sigma)


def rtnet_loss(head: nn.Module, u: Tensor, y: Tensor, u_hat: Tensor, protos: Tensor, labels_c: Tensor,
               u_hat_c: Tensor | None, beta: float, sigma: Tensor | None, proto_mmd: str = "prototype",
               reduction: str = "mean", kind: str = "mmd") -> Tensor:
    """Eq. (6): -Ent(h(u_hat)) - Sigma_c Ent(h(u_hat_c)) + beta (d(u_hat, u) + Sigma_c d(u_hat_c, u_bar_c)).

    The class-c MMD compares with the prototype as a one-sample set, or (`proto_mmd="real"`) with the batch's
    real class-c embeddings when it has any."""
    u = u.detach()
    loss = rtnet_term(head(u_hat), u_hat, u, beta, sigma, kind)
    if u_hat_c is None or not len(labels_c):
        return loss
    logits_c, terms = head(u_hat_c), []
    for c in torch.unique(labels_c):
        mask = labels_c == c
        real = u[y == c] if proto_mmd == "real" else u[:0]
        target = real if len(real) else protos[c].detach()[None]
        terms.append(rtnet_term(logits_c[mask], u_hat_c[mask], target, beta, sigma, kind))
    total = torch.stack(terms)
    return loss + (total.sum() if reduction == "sum" else total.mean())


def rtnet_loss_batch(head: nn.Module, u: Tensor, u_hat: Tensor, protos: Tensor, labels_c: Tensor,
                     u_hat_c: Tensor | None, beta: float, sigma: Tensor | None, kind: str) -> Tensor:
    """The official L_FT (user_FRAug.py:237-275): `rtnet_term` on each branch's whole batch, targets u (real
    branch) and u_bar[labels_c] (prototype branch), the two branches averaged."""
    terms = [rtnet_term(head(u_hat), u_hat, u.detach(), beta, sigma, kind)]
    if u_hat_c is not None and len(labels_c):
        terms.append(rtnet_term(head(u_hat_c), u_hat_c, protos.detach()[labels_c], beta, sigma, kind))
    return torch.stack(terms).mean()


def residual(gen: nn.Module | None, rt: nn.Module | None, z: Tensor | None, y: Tensor, base: Tensor | None
             ) -> Tensor:
    """m(g(z, y), y); g(z, y) without the RTNet; m(base, y) without the generator (base: u, or u_hat_c's source)."""
    if gen is not None:
        v: Tensor = gen(z, y)  # nn.Module calls are untyped in torch
    elif base is not None:
        v = base.detach()
    else:
        raise ValueError("fraug: a residual without the generator needs the RTNet's input")
    return v if rt is None else rt(v.detach(), y)


@dataclass(frozen=True)
class Draws:
    """A step's random draws: the labels c of the u_hat_c, z for u_hat and z' for u_hat_c (without the
    generator: z is None and z' holds the picked real class-c embeddings' indices, -1: the prototype)."""

    labels_c: Tensor
    z: Tensor | None
    z2: Tensor


def initial_prototypes(protos: Tensor | None, seen: Tensor | None, num_classes: int, dim: int, zeros: bool,
                       device: torch.device) -> tuple[Tensor, Tensor]:
    """The client's prototypes and seen flags; before it has any, zeros flagged seen (`zeros`) or unseen."""
    if protos is not None and seen is not None:
        return protos.to(device), seen.to(device)
    return (torch.zeros(num_classes, dim, device=device),
            torch.full((num_classes,), zeros, dtype=torch.bool, device=device))


@contextmanager
def eval_mode(*nets: nn.Module | None) -> Iterator[None]:
    """The given networks in eval mode (BatchNorm on running statistics) inside the block, restored after."""
    modes = [(n, n.training) for n in nets if n is not None]
    for n, _ in modes:
        n.eval()
    try:
        yield
    finally:
        for n, mode in modes:
            n.train(mode)


@torch.no_grad()
def features_keep_bn(model: SplitModel, x: Tensor) -> Tensor:
    """f(x) in train mode with the BatchNorm running statistics restored afterwards."""
    saved = [b.clone() for b in model.buffers()]
    u: Tensor = model.features(x)
    for b, s in zip(model.buffers(), saved, strict=True):
        b.copy_(s)
    return u


@torch.no_grad()
def features_eval(model: SplitModel, x: Tensor) -> Tensor:
    """f(x) with BatchNorm in eval mode (running statistics), as the official stage 2 (user_FRAug.py:197, 215)."""
    with eval_mode(model):
        u: Tensor = model.features(x)
    return u


@torch.no_grad()
def step_diagnostics(gen_loss: Tensor, rt_loss: Tensor, u: Tensor, res: Tensor, sigma: Tensor | None) -> Tensor:
    """A stage-2 step's diagnostics (fraug.DIAGNOSTICS): the two losses, the unweighted MMD(u + res, u), the mean
    norms of the residual and of u, and the MMD's bandwidth."""
    s = median_heuristic_sigma(u + res, u) if sigma is None else sigma
    mmd = gaussian_mmd(u + res, u, s)
    norms = res.norm(dim=1).mean(), u.norm(dim=1).mean()
    return torch.stack([gen_loss.detach(), rt_loss.detach(), mmd, *norms, s.reshape(())]).float().cpu()
