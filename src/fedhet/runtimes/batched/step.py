"""The algorithm's own loss, evaluated per lane with the lane's tensors, and its vmapped optimizer step.

`RoutedWork.bound(states, tensors)` re-routes lane 0's Work for one call of a `loss_of`: every module field is
replaced by the runtime's functional copy of it (BatchNorm -> `FunctionalBatchNorm`, norm.py) whose parameters and
buffers are the lane's (`torch.nn.utils.stateless._reparametrize_module`, so `module.parameters()` and
`named_parameters()` inside the loss, e.g. FedProx's and Ditto's proximal terms, see the lane's tensors too),
tensor fields (FedProx's anchor) are the lane's, and the other per-client fields are guards (rule.py, rule 5).
`RoutedWork.guarded()`, around a pass's steps, makes a call of an original module refuse (rule 3).
BatchNorm running statistics come back as outputs, not in-place writes.

`stage_step(...)` is one stage of a `LossStep` for every lane (each argument has a leading lane dimension):

    step(grad_state, rest, tensors, opt_state, x, y) -> (new trained parameters, BatchNorm updates, opt_state', loss)

the gradient of `loss_of(x, y)` by `torch.func.grad` with respect to every parameter that requires grad in the
pass (as in-process, where `p.requires_grad` is what the loss sees), the optimizer's own clipping (both
`vmap`ped over a leading lane dimension), then its functional update (optim.py) on that optimizer's parameters
only, applied to the lane-stacked tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import grad, vmap
from torch.nn.utils.stateless import _reparametrize_module

from fedhet.core.contract import LossFn, Work
from fedhet.runtimes.batched.norm import BatchNormContext, FunctionalBatchNorm, batch_norm_context, convert
from fedhet.runtimes.batched.optim import FunctionalOptimizer, OptState, Tensors, TensorTree, clip_grad_norm
from fedhet.runtimes.batched.rule import Guard, GuardedRead, Layout

StepFn = Callable[..., tuple[Tensors, Tensors, OptState, torch.Tensor]]


@dataclass
class Functional:
    """The runtime's copy of one module field: BatchNorm swapped for `FunctionalBatchNorm` (norm.convert)."""

    module: nn.Module
    layers: list[FunctionalBatchNorm]

    @classmethod
    def of(cls, module: nn.Module) -> Functional:
        converted, layers = convert(module)
        return cls(converted, layers)

    def follow(self, original: nn.Module) -> None:
        """Take the original's train / eval mode, module by module (norm.convert keeps the names)."""
        mine = dict(self.module.named_modules())
        for name, module in original.named_modules():
            mine[name].training = module.training


class RoutedWork:
    """Lane 0's Work, whose per-client fields `bound` replaces by a lane's values for one loss call."""

    def __init__(self, work: Work, layout: Layout, functional: dict[str, Functional]) -> None:
        self.work, self.layout, self.functional = work, layout, functional

    @contextmanager
    def bound(self, states: Tensors, tensors: dict[str, TensorTree]) -> Iterator[Tensors]:
        """Within the block the Work's fields are the lane's; the yielded dict receives, at the block's end, the
        BatchNorm running-statistic updates, keyed `"field:name"` like `states`."""
        layout, work = self.layout, self.work
        saved = {f: getattr(work, f) for f in [*layout.modules, *layout.tensors, *layout.guarded]}
        per_field: dict[str, Tensors] = {f: {} for f in layout.modules}
        for key, value in states.items():
            f, _, name = key.partition(":")
            per_field[f][name] = value
        contexts = {f: BatchNormContext() for f in layout.modules}
        updates: Tensors = {}
        try:
            with ExitStack() as stack:
                for f in layout.modules:
                    fm = self.functional[f]
                    stack.enter_context(_reparametrize_module(fm.module, per_field[f]))
                    stack.enter_context(batch_norm_context(fm.layers, contexts[f]))
                    setattr(work, f, fm.module)
                for f in layout.tensors:
                    setattr(work, f, tensors[f])
                for f in layout.guarded:
                    setattr(work, f, Guard(f))
                yield updates
            for f, ctx in contexts.items():
                updates.update({f"{f}:{k}": v for k, v in ctx.updates.items()})
        finally:
            for f, value in saved.items():
                setattr(work, f, value)

    @contextmanager
    def guarded(self) -> Iterator[None]:
        """Within the block, calling one of the Work's original modules by another way than its field (which
        `bound` re-routes) refuses (rule 3): a forward pre-hook on each, installed once around a pass's steps
        rather than per loss call."""
        handles = [getattr(self.work, f).register_forward_pre_hook(_outside(f)) for f in self.layout.modules]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _outside(name: str) -> Callable[..., None]:
    def refuse(*_: object) -> None:
        raise GuardedRead(f"its loss calls the module of work.{name} by another way than the Work field (rule 3)")

    return refuse


GradFn = Callable[..., tuple[Tensors, Tensors, torch.Tensor]]


def stage_grads(routed: RoutedWork, loss_of: LossFn, opt_keys: list[str], grad_clip: float | None) -> GradFn:
    """Each lane's gradient of `loss_of(x, y)` (clipped where `grad_clip`), vmapped over the lane dimension:

        grads(grad_state, rest, tensors, x, y) -> (gradients of opt_keys, BatchNorm updates, loss)"""

    def loss_fn(trained: Tensors, rest: Tensors, tensors: dict[str, TensorTree], x: torch.Tensor, y: torch.Tensor
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, Tensors]]:
        with routed.bound({**rest, **trained}, tensors) as updates:
            loss = loss_of(x, y)
        return loss, (loss.detach(), updates)

    def lane_grads(trained: Tensors, rest: Tensors, tensors: dict[str, TensorTree], x: torch.Tensor, y: torch.Tensor
                   ) -> tuple[Tensors, Tensors, torch.Tensor]:
        grads, (loss, updates) = grad(loss_fn, has_aux=True)(trained, rest, tensors, x, y)
        own = {k: grads[k] for k in opt_keys}
        return (own if grad_clip is None else clip_grad_norm(own, grad_clip)), updates, loss

    return vmap(lane_grads)


def stage_step(routed: RoutedWork, loss_of: LossFn, opt_keys: list[str], optimizer: FunctionalOptimizer,
               grad_clip: float | None) -> StepFn:
    """One stage for all lanes (module docstring): each lane's gradient (and its clipping) vmapped over the lane
    dimension, then the optimizer's update on the stacked tensors, where every per-lane value broadcasts
    (optim.py); the same arithmetic as the update under vmap, at a fraction of its cost on a small model. The
    optimizer's parameters and state are updated in place (donated): the caller passes tensors it owns."""
    vmapped = stage_grads(routed, loss_of, opt_keys, grad_clip)

    def step(trained: Tensors, rest: Tensors, tensors: dict[str, TensorTree], opt_state: OptState, x: torch.Tensor,
             y: torch.Tensor) -> tuple[Tensors, Tensors, OptState, torch.Tensor]:
        own, updates, loss = vmapped(trained, rest, tensors, x, y)
        new_params, new_state = optimizer.update({k: trained[k] for k in opt_keys}, own, opt_state, donate=True)
        return new_params, updates, new_state, loss

    return step


Cache = dict[str, tuple[nn.Module, Functional]]


def functional_copies(work: Work, layout: Layout, cache: Cache) -> dict[str, Functional]:
    """The functional copy of each module field (built once per field and module object), in the field's current
    train / eval modes."""
    out = {}
    for f in layout.modules:
        original: nn.Module = getattr(work, f)
        if f not in cache or cache[f][0] is not original:
            cache[f] = (original, Functional.of(original))
        fm = cache[f][1]
        fm.follow(original)
        out[f] = fm
    return out
