"""Which fits the batched runtime vectorizes: the rule, checked on every sampled client's own Work and passes.

A client's fit is `Algorithm.start` (its `Work`), the `LocalPass`es of `Algorithm.passes(work)`, then
`Algorithm.finish`. The runtime runs lane 0's passes for every lane at once, with each lane's values substituted
into lane 0's Work (step.py). That is the same computation as each client's own passes when:

1. every pass's step is a `LossStep` (`minimize`, `loss_pass`): the runtime evaluates its `loss_of`; any other
   step function is imperative code it cannot see into;
2. every optimizer a stage steps is sgd / adam / adamw without `after_backward` (a gradient edit is imperative)
   and without `lr_schedule` or non-default `betas`;
3. the modules the loss reads are fields of the Work (`nn.Module` values), called through those fields, no two
   sharing a parameter, without hooks (and, norm.py, without dropout or buffers other than BatchNorm's); the
   optimizers' parameters and the frozen ones belong to them;
4. each lane's `loss_of` is lane 0's function (same code) closing over the same objects, except its own Work
   and its own copy of the method (`with_hparams`, FedPop's per-client vectors) when the copies share a
   `lane_group`, and none of them a module or tensor (those must be reached through the Work);
5. the loss reads from the Work only its module and tensor fields, and scalar fields equal on every client:
   the others (`msg`, `ctx`, per-client objects) are replaced by a guard that refuses any read (`GuardedRead`);
6. every lane's Work and passes have lane 0's shape (field kinds, tensor shapes, pass names, stages, optimizer
   kinds and settings other than lr / momentum / weight decay, trained and frozen parameters);
7. the loss runs under `torch.func.vmap` and `grad` (no random numbers, no data-dependent Python branches,
   no `.item()`): runtime.py turns such a failure into a refusal.

Anything else is refused with one ConfigError naming `run.runtime=inprocess` and the rule that failed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedhet.algorithms.base import Algorithm
from fedhet.config import TrainConfig
from fedhet.core.contract import LocalPass, LossStep, OptimSpec, Work
from fedhet.errors import ConfigError

KINDS = ("sgd", "adam", "adamw")
SCALARS = (int, float, str, bool, type(None))
LANED_TRAIN = ("lr", "momentum", "weight_decay", "local_epochs", "local_steps", "batch_size")
SERVER_SIDE = ("server_cfg", "server_opt")  # read by aggregation only, never by a client's fit


def lane_group(alg: Algorithm[Any, Any, Any, Any]) -> tuple[Any, ...]:
    """Copies of one method (`with_hparams`) whose clients may be lanes of one vectorized step share this key:
    the same objects built in `__init__` and the same settings, except the ones the runtime lanes (the local
    optimizer's lr / momentum / weight decay, the step count and batch size: `LANED_TRAIN`; the method's
    `capabilities.lane_params`, which its `start` puts into the Work as tensors) and the server's. Clients of
    copies with different keys are trained in separate groups."""
    neutral = TrainConfig()
    train = dataclasses.replace(alg.train_cfg, **{f: getattr(neutral, f) for f in LANED_TRAIN})
    laned = alg.capabilities.lane_params
    params = alg.params
    fixed = [(f.name, getattr(params, f.name)) for f in dataclasses.fields(params) if f.name not in laned] \
        if dataclasses.is_dataclass(params) else [("params", params)]
    shared = sorted((k, id(v)) for k, v in vars(alg).items() if k not in ("train_cfg", "params", *SERVER_SIDE))
    return (type(alg), tuple(shared), repr(train), repr(fixed))


def refusal(method: str, why: str) -> ConfigError:
    """The one error of a refused method: which rule failed, and the runtime to use instead."""
    return ConfigError(f"method '{method}' cannot run on run.runtime=batched: {why} (rules: "
                       f"docs/runtimes_batched.md). Run it with run.runtime=inprocess.")


class GuardedRead(Exception):
    """The loss read a Work field that differs between clients and is neither a module nor a tensor."""


class Guard:
    """Stands in for a per-client Work field during the vectorized loss; any attribute read refuses."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        raise GuardedRead(f"its loss reads work.{object.__getattribute__(self, '_name')}.{attr}, which is not a "
                          "module, tensor or common scalar field of the Work (rule 5)")


@dataclass
class LaneWork:
    """One sampled client's fit as the runtime holds it: the Work, its passes, and right after `start` the state of
    every module field (`"field:name"` -> tensor) and the tensor fields (field -> tensor or tuple of tensors)."""

    work: Work
    passes: list[LocalPass]
    states: dict[str, torch.Tensor] = field(default_factory=dict)
    tensors: dict[str, Any] = field(default_factory=dict)


@dataclass
class Layout:
    """Lane 0's Work fields by kind, and which state keys (`"field:name"`) each optimizer of each pass trains."""

    modules: list[str]
    tensors: list[str]
    guarded: list[str]
    keys: dict[int, str]  # id(parameter or buffer) of lane 0's modules -> "field:name"


def is_tensors(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or (isinstance(value, tuple | list) and bool(value)
                                               and all(isinstance(v, torch.Tensor) for v in value))


def snapshot(work: Work, passes: list[LocalPass]) -> LaneWork:
    """Copy what `start` put in the Work (its modules may be reused buffers the next client's `start` overwrites)."""
    lane = LaneWork(work, passes)
    for f in dataclasses.fields(work):
        value = getattr(work, f.name)
        if isinstance(value, nn.Module):
            named = [*value.named_parameters(), *value.named_buffers()]
            lane.states.update({f"{f.name}:{n}": t.detach().clone() for n, t in named})
        elif is_tensors(value):
            lane.tensors[f.name] = (value.detach().clone() if isinstance(value, torch.Tensor)
                                    else tuple(t.detach().clone() for t in value))
    return lane


def shape_key(work: Work) -> tuple[tuple[str, str], ...]:
    """The kind of each Work field (module type, tensor shapes, None, other): clients with equal keys are
    trained together, so that a field set for some clients only (MOON's previous model) splits the chunk."""
    def kind(value: Any) -> str:
        if isinstance(value, nn.Module):
            return f"module {type(value).__name__}"
        if is_tensors(value):
            return f"tensors {[tuple(t.shape) for t in (value if isinstance(value, tuple | list) else (value,))]}"
        return "none" if value is None else "other"

    return tuple((f.name, kind(getattr(work, f.name))) for f in dataclasses.fields(work))


def layout_of(method: str, lanes: list[LaneWork]) -> Layout:
    """Rules 3, 5 and 6 on the Work fields; the state keys of lane 0's parameters and buffers."""
    work0 = lanes[0].work
    out = Layout([], [], [], {})
    for f in dataclasses.fields(work0):
        values = [getattr(lane.work, f.name) for lane in lanes]
        first = values[0]
        if isinstance(first, nn.Module):
            if not all(isinstance(v, type(first)) for v in values):
                raise refusal(method, f"work.{f.name} is a module for some clients only (rule 6)")
            out.modules.append(f.name)
        elif is_tensors(first):
            shapes = {tuple(tuple(t.shape) for t in (v if isinstance(v, tuple | list) else (v,))) for v in values}
            if len(shapes) > 1 or not all(is_tensors(v) for v in values):
                raise refusal(method, f"work.{f.name} has different shapes on different clients (rule 6)")
            out.tensors.append(f.name)
        elif any(isinstance(v, nn.Module) or is_tensors(v) for v in values):
            raise refusal(method, f"work.{f.name} is a module or tensor for some clients only (rule 6)")
        elif not all(isinstance(v, SCALARS) and v == first for v in values):
            out.guarded.append(f.name)
    for name in out.modules:
        module: nn.Module = getattr(work0, name)
        if any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in module.modules()):
            raise refusal(method, f"work.{name} has hooks, which the vectorized forward cannot re-route (rule 3)")
        for n, t in [*module.named_parameters(), *module.named_buffers()]:
            if id(t) in out.keys:
                raise refusal(method, f"work.{name} shares {n} with another module field (rule 3)")
            out.keys[id(t)] = f"{name}:{n}"
    return out


def check_passes(method: str, lanes: list[LaneWork], layout: Layout) -> None:
    """Rules 1, 2, 4 and 6 on every lane's passes against lane 0's."""
    template = lanes[0].passes
    for lane in lanes:
        if [p.name for p in lane.passes] != [p.name for p in template]:
            raise refusal(method, "clients have different passes (rule 6)")
    for k, p0 in enumerate(template):
        if not isinstance(p0.step, LossStep):
            raise refusal(method, f"pass '{p0.name}' has its own step function, not a LossStep (minimize / "
                          "loss_pass) whose loss the runtime can vectorize (rule 1)")
        for loss_of, opt in p0.step.stages:
            cells = getattr(loss_of, "__closure__", None) or ()
            if any(isinstance(c.cell_contents, nn.Module | torch.Tensor) for c in cells):
                raise refusal(method, f"pass '{p0.name}': its loss_of holds a module or tensor itself, not through "
                              "the Work (rule 4)")
            spec = p0.optimizers.get(opt)
            if spec is None or spec.kind not in KINDS or spec.after_backward is not None \
                    or spec.lr_schedule is not None or spec.betas != (0.9, 0.999):
                raise refusal(method, f"pass '{p0.name}' steps optimizer '{opt}', which is not a plain "
                              f"{' / '.join(KINDS)} optimizer (default betas, no after_backward, no lr_schedule) "
                              "(rule 2)")
            param_keys(method, p0, spec, layout)
        keys0 = shape_of(lanes[0], k, layout)
        for lane in lanes[1:]:
            if shape_of(lane, k, layout) != keys0:
                raise refusal(method, f"pass '{p0.name}' differs between clients (rule 6)")
            step = lane.passes[k].step
            assert isinstance(step, LossStep)  # shape_of compared the stages
            for (f0, _), (fi, _) in zip(p0.step.stages, step.stages, strict=True):
                if not same_function(f0, fi, lanes[0].work, lane.work):
                    raise refusal(method, f"pass '{p0.name}': a client's loss_of is not the same function as the "
                                  "others' over its own Work (rule 4)")


def param_keys(method: str, local_pass: LocalPass, spec: OptimSpec, layout: Layout) -> list[str]:
    """State keys of an optimizer's parameters (lane 0's modules), in its order."""
    missing = [p for p in spec.params if id(p) not in layout.keys]
    if missing:
        raise refusal(method, f"pass '{local_pass.name}' trains parameters outside the Work's module fields (rule 3)")
    return [layout.keys[id(p)] for p in spec.params]


def shape_of(lane: LaneWork, k: int, layout: Layout) -> tuple[Any, ...]:
    """What must agree between lanes for pass `k`: stages, optimizers, trained / frozen / train-mode keys."""
    p = lane.passes[k]
    if not isinstance(p.step, LossStep):
        return ("opaque",)
    keys = {id(t): key for name in layout.modules
            for key, t in _named(getattr(lane.work, name), name)}
    optims = tuple((name, dataclasses.replace(spec, params=(), after_backward=None, lr=0.0, momentum=0.0,
                                              weight_decay=0.0),
                    tuple(keys.get(id(q)) for q in spec.params)) for name, spec in sorted(p.optimizers.items()))
    frozen = tuple(keys.get(id(q)) for q in p.frozen)
    modules = tuple(next((n for n in layout.modules if getattr(lane.work, n) is m), None) for m in p.modules)
    return (tuple(opt for _, opt in p.step.stages), optims, frozen, modules, p.report)


def _named(module: nn.Module, prefix: str) -> list[tuple[str, torch.Tensor]]:
    return [(f"{prefix}:{n}", t) for n, t in [*module.named_parameters(), *module.named_buffers()]]


def same_function(f0: Any, fi: Any, work0: Work, worki: Work) -> bool:
    """Rule 4: same code, same defaults, and closure cells holding the same objects except each lane's Work and
    its copy of the method (same `lane_group`)."""
    if f0 is fi:
        return True
    code = getattr(f0, "__code__", None)
    if code is None or code is not getattr(fi, "__code__", None) or f0.__defaults__ is not fi.__defaults__:
        return False
    cells0, cellsi = f0.__closure__ or (), fi.__closure__ or ()
    return len(cells0) == len(cellsi) and all(
        _same_cell(a.cell_contents, b.cell_contents, work0, worki) for a, b in zip(cells0, cellsi, strict=True))


def _same_cell(a: Any, b: Any, work0: Work, worki: Work) -> bool:
    if a is b or (a is work0 and b is worki):
        return True
    return isinstance(a, Algorithm) and isinstance(b, Algorithm) and lane_group(a) == lane_group(b)
