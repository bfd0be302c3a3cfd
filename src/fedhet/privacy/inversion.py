"""Update inversion: reconstruct a client's training images from what it uploaded (the shared weights it returns
minus the global model it received).

The attacker (the server, or anyone who sees the upload) knows the architecture, the broadcast global model and
the local training hyperparameters (plain SGD: lr, momentum, weight decay, the number of local steps). It
simulates the client's local steps on a dummy batch differentiably (Geiping et al. 2020, "Inverting Gradients",
NeurIPS, §5 "the multi-step case": the update of several local steps is matched as a whole; one step is plain
gradient matching, since update = -lr * gradient) and moves the dummy images until the simulated update matches the
observed one, over the uploaded parameters only (`matched`: what the method sends, e.g. no BatchNorm for FedBN;
parameters the server never sees take the values it assumes, the initial model's).

- `dlg`: Zhu, Liu & Han 2019 ("Deep Leakage from Gradients", NeurIPS): squared L2 distance between the simulated
  and observed updates (divided by lr^2, i.e. in gradient units), L-BFGS on the dummy images. Zhu et al. also
  optimize a soft dummy label; the labels here are inferred or given (iDLG, Zhao et al. 2020), which makes it
  easier. fedhet's L-BFGS uses a strong-Wolfe line search (Zhu et al.'s code: lr 1, none), more stable.
- `ig`: Geiping et al. 2020: 1 - cosine similarity of the two updates (all matched arrays as one vector) plus
  `tv` x the total variation of the images, Adam (lr 0.1) on the *signed* gradient of the dummy images, the learning
  rate divided by 10 at 3/8, 5/8 and 7/8 of the iterations (inversefed's defaults: lr 0.1, total_variation 0.1);
  no box constraint (the data's normalisation is not known in general).
- Labels: for a batch of one, iDLG's rule (Zhao, Mopuri & Bilen 2020, "iDLG"): with non-negative features the
  gradient of the last layer's weight row of the true class is the only negative one, so after an SGD step its
  update row is the one with the largest sum. Otherwise (a larger batch, or a head the method does not upload)
  the true labels are given to the attacker, as Geiping et al. assume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedhet.core.batches import restrict_logits
from fedhet.core.seeding import torch_generator
from fedhet.errors import FedhetError
from fedhet.losses.descent import descend
from fedhet.runtimes.batched.optim import SGD

METHODS = ("dlg", "ig")
IG_LR, TV_WEIGHT = 0.1, 0.1  # inversefed's DEFAULT_CONFIG


@dataclass(frozen=True)
class LocalSGD(SGD):
    """The client's local training as the attacker simulates it: `steps` steps of torch's SGD (the lanes' pure
    form, runtimes/batched/optim.py) on the one batch."""

    steps: int = 1


@dataclass
class Observed:
    """What the attacker sees and knows: its copy of the client's model at the start of the round (broadcast
    weights plus its assumption for the rest), the observed update of each matched parameter, the local
    training, and the client's classes (None: all)."""

    model: nn.Module
    update: dict[str, torch.Tensor]
    sgd: LocalSGD
    classes: Sequence[int] | None = None


def simulated_update(obs: Observed, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The update of the matched parameters after `obs.sgd.steps` SGD steps on (x, y) from `obs.model`'s weights
    (every trainable parameter steps; torch's SGD: buffer = g, then momentum * buffer + g), differentiable in x."""
    model = obs.model.train()
    start = {k: p.detach().requires_grad_(True) for k, p in model.named_parameters() if p.requires_grad}
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    sgd = obs.sgd
    params, opt_state = start, sgd.init(start)
    for _ in range(sgd.steps):
        logits = restrict_logits(functional_call(model, {**buffers, **params}, (x,)), obs.classes)
        grads = torch.autograd.grad(F.cross_entropy(logits, y), list(params.values()), create_graph=True)
        params, opt_state = sgd.update(params, dict(zip(params, grads, strict=True)), opt_state)
    return {k: params[k] - start[k] for k in obs.update}


def l2_distance(sim: dict[str, torch.Tensor], obs: Observed) -> torch.Tensor:
    """DLG's objective: sum of squared differences, in gradient units (divided by lr^2)."""
    total = sum(((sim[k] - obs.update[k]) ** 2).sum() for k in obs.update)
    return torch.as_tensor(total) / obs.sgd.lr**2


def cosine_distance(sim: dict[str, torch.Tensor], obs: Observed) -> torch.Tensor:
    """Geiping et al.'s objective: 1 - cos(simulated, observed), all matched arrays as one vector."""
    dot = sum((sim[k] * obs.update[k]).sum() for k in obs.update)
    norm_sim = torch.sqrt(torch.as_tensor(sum(sim[k].pow(2).sum() for k in obs.update)))
    norm_obs = torch.sqrt(torch.as_tensor(sum(obs.update[k].pow(2).sum() for k in obs.update)))
    return 1.0 - torch.as_tensor(dot) / (norm_sim * norm_obs).clamp_min(1e-30)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of horizontal and of vertical neighbours (inversefed's total_variation)."""
    return (x[..., :, 1:] - x[..., :, :-1]).abs().mean() + (x[..., 1:, :] - x[..., :-1, :]).abs().mean()


def infer_label(obs: Observed, head_weight: str | None) -> int | None:
    """iDLG's label of a one-image batch: the row of the last layer's weight update with the largest sum (module
    docstring); None when that weight is not uploaded."""
    if head_weight is None or head_weight not in obs.update:
        return None
    return int(torch.argmax(obs.update[head_weight].sum(dim=1)))


def reconstruct(obs: Observed, labels: torch.Tensor, shape: Sequence[int], method: str, iters: int, seed: int = 0,
                tv: float = TV_WEIGHT, restarts: int = 1) -> tuple[torch.Tensor, float]:
    """The dummy batch (shape N x C x H x W) after `iters` iterations of `method` ("dlg" or "ig") with the lowest
    final objective of `restarts` tries (Geiping et al.'s restarts), and that objective. Try r starts from N(0, 1)
    drawn from (seed, "inversion", r)."""
    if method not in METHODS:
        raise FedhetError(f"unknown inversion method '{method}': choose dlg or ig")
    device = next(obs.model.parameters()).device
    labels, best = labels.to(device), (torch.empty(0), float("inf"))
    for r in range(restarts):
        x = torch.randn(tuple(shape), generator=torch_generator(seed, "inversion", r)).to(device).requires_grad_(True)
        objective = dlg(obs, x, labels, iters) if method == "dlg" else inverting_gradients(obs, x, labels, iters, tv)
        if r == 0 or objective < best[1]:
            best = (x.detach(), objective)
    return best


def dlg(obs: Observed, x: torch.Tensor, labels: torch.Tensor, iters: int) -> float:
    """L-BFGS on x (in place) against the L2 distance; the final objective."""
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=iters, history_size=100, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-12, tolerance_change=1e-15)

    def closure() -> torch.Tensor:  # L-BFGS re-evaluates: the gradient only, its own step does the rest
        loss = l2_distance(simulated_update(obs, x, labels), obs)
        (x.grad,) = torch.autograd.grad(loss, [x])
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(l2_distance(simulated_update_nograd(obs, x, labels), obs))


def inverting_gradients(obs: Observed, x: torch.Tensor, labels: torch.Tensor, iters: int, tv: float) -> float:
    """Signed Adam on x (in place) against the cosine distance plus total variation; the final objective."""
    opt = torch.optim.Adam([x], lr=IG_LR)
    milestones = [iters * 3 // 8, iters * 5 // 8, iters * 7 // 8]
    schedule = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)

    def signed() -> None:  # Geiping et al.: Adam on the gradient's sign
        if x.grad is not None:
            x.grad.sign_()

    for _ in range(iters):
        loss = cosine_distance(simulated_update(obs, x, labels), obs) + tv * total_variation(x)
        descend(opt, loss, "the inversion's dummy images", "try --method dlg or fewer --iters", before_step=signed)
        schedule.step()
    return float(cosine_distance(simulated_update_nograd(obs, x, labels), obs) + tv * total_variation(x.detach()))


def simulated_update_nograd(obs: Observed, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """`simulated_update` of the final images, detached."""
    with torch.enable_grad():
        return {k: v.detach() for k, v in simulated_update(obs, x.detach(), labels).items()}
