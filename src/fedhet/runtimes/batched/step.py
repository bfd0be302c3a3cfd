"""The client step as a pure function, and its vmapped form over a stack of clients ("lanes").

    step(params, buffers, opt_state, anchor, mu, x, y, sample_mask, active)
        -> (params', buffers', opt_state', loss)

is one local optimizer step of one client, the batched counterpart of `engine.local.optimizer_step` on
`Algorithm.loss`: the loss is the masked mean cross-entropy over the real samples of the (padded) batch plus
(mu / 2) * sum_p ||p - anchor_p||^2 over the trainable parameters (FedProx's eq. 2, Ditto's personal
objective; mu = 0 is plain FedAvg); its gradient by `torch.func.grad` through `functional_call`; optional
gradient clipping; a functional optimizer update (optim.py). BatchNorm running statistics come back as
outputs (norm.py). A step in which no lane needs padding passes mask None and uses exactly the in-process
loss (mean cross-entropy) and torch's BatchNorm kernel. A lane whose `active` flag is 0 (a client that has
finished its steps) keeps its parameters, buffers and optimizer state unchanged: the new values are computed
and discarded with `torch.where`, which is what lets clients with different step counts share one step.

`vmap(step)` runs the step for every lane at once; all tensor arguments carry a leading lane dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedhet.runtimes.batched.norm import BatchNormContext, MaskedBatchNorm, batch_norm_context, convert
from fedhet.runtimes.batched.optim import FunctionalOptimizer, OptState, Tensors, clip_grad_norm

StepFn = Callable[..., tuple[Tensors, Tensors, OptState, torch.Tensor]]


@dataclass
class FunctionalModel:
    """A model split into trainable parameters and everything else, callable as f(params, buffers, x, mask).

    `buffers` holds the buffers and any frozen (requires_grad=False) parameters; only BatchNorm buffers
    change in training, and they come back from `forward` instead of being written in place.
    """

    module: nn.Module
    bn_layers: list[MaskedBatchNorm]
    param_names: list[str]  # trainable parameters, in `model.parameters()` order (torch.optim's index order)
    buffer_names: list[str]

    @classmethod
    def of(cls, model: nn.Module) -> FunctionalModel:
        """Convert `model` (a copy is made; the original is untouched)."""
        module, layers = convert(model)
        module.train()
        params = [n for n, p in module.named_parameters() if p.requires_grad]
        frozen = [n for n, p in module.named_parameters() if not p.requires_grad]
        buffers = [n for n, _ in module.named_buffers()]
        return cls(module, layers, params, frozen + buffers)

    def forward(self, params: Tensors, buffers: Tensors, x: torch.Tensor, mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, Tensors]:
        """Logits and the updated BatchNorm buffers (the others are returned unchanged)."""
        with batch_norm_context(self.bn_layers, BatchNormContext(mask)) as ctx:
            logits = functional_call(self.module, (params, buffers), (x,))
        return logits, {**buffers, **ctx.updates}


def proximal(params: Tensors, anchor: Tensors) -> torch.Tensor:
    """sum_p ||p - a_p||^2 in parameter order (as `algorithms.fedprox.proximal_term`)."""
    return torch.stack([(p - anchor[k]).pow(2).sum() for k, p in params.items()]).sum()


def make_step(model: FunctionalModel, optimizer: FunctionalOptimizer, grad_clip: float | None,
              use_prox: bool, donate: bool = False) -> StepFn:
    """The single-client step (see the module docstring); `use_prox` False skips the proximal term. With
    `donate`, a step with every lane active updates the parameters and optimizer state in place (the caller
    owns them and uses only the returned values); otherwise the inputs are untouched."""

    def loss_fn(params: Tensors, buffers: Tensors, anchor: Tensors, mu: torch.Tensor, x: torch.Tensor,
                y: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, tuple[torch.Tensor, Tensors]]:
        logits, new_buffers = model.forward(params, buffers, x, mask)
        if mask is None:  # no padding in this step: the plain mean, as in-process
            loss = nn.functional.cross_entropy(logits, y)
        else:
            w = mask.to(logits.dtype)
            loss = (nn.functional.cross_entropy(logits, y, reduction="none") * w).sum() / w.sum().clamp_min(1.0)
        if use_prox:
            loss = loss + 0.5 * mu * proximal(params, anchor)
        return loss, (loss.detach(), new_buffers)

    def step(params: Tensors, buffers: Tensors, opt_state: OptState, anchor: Tensors, mu: torch.Tensor,
             x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None, active: torch.Tensor | None
             ) -> tuple[Tensors, Tensors, OptState, torch.Tensor]:
        grads, (loss, new_buffers) = grad(loss_fn, has_aux=True)(params, buffers, anchor, mu, x, y, mask)
        if grad_clip is not None:
            grads = clip_grad_norm(grads, grad_clip)
        if active is None:  # every lane steps: nothing to keep, so the step may update its inputs in place
            new_params, new_state = optimizer.update(params, grads, opt_state, donate=donate)
            return new_params, new_buffers, new_state, loss
        new_params, new_state = optimizer.update(params, grads, opt_state)
        keep = _keep(active)
        return (keep(new_params, params), keep(new_buffers, buffers),
                {slot: keep(new_state[slot], opt_state[slot]) for slot in opt_state}, loss)

    return step


def _keep(active: torch.Tensor) -> Callable[[Tensors, Tensors], Tensors]:
    """new where active else old, entry by entry."""

    def select(new: Tensors, old: Tensors) -> Tensors:
        return {k: torch.where(active, new[k], old[k]) for k in old}

    return select


def vmapped_step(model: FunctionalModel, optimizer: FunctionalOptimizer, grad_clip: float | None,
                 use_prox: bool, donate: bool = False) -> StepFn:
    """`make_step` vectorized over a leading lane dimension of every argument; the sample mask and the active
    flags may be None (no padding in this step; every lane active), which skips the masking work."""
    step = make_step(model, optimizer, grad_clip, use_prox, donate)
    mapped: dict[tuple[int | None, ...], StepFn] = {}

    def run(*args: object) -> tuple[Tensors, Tensors, OptState, torch.Tensor]:
        in_dims = tuple(None if a is None else 0 for a in args)
        if in_dims not in mapped:
            mapped[in_dims] = vmap(step, in_dims=in_dims)
        return mapped[in_dims](*args)

    return run
