"""Which fits the batched runtime vectorizes: the rule, checked on every sampled client's own Work and passes.

The runtime runs lane 0's passes (`Algorithm.passes(work)`) for every lane at once, each lane's values substituted
into lane 0's Work (step.py). That is each client's own computation when (in full: docs/runtimes_batched.md)

1. every pass's step is a `LossStep` (`minimize`, `loss_pass`);
2. every optimizer a stage steps is sgd / adam / adamw without `after_backward`, `lr_schedule` or non-default `betas`;
3. the loss reads modules only as `nn.Module` fields of the Work, sharing no parameter, without hooks (norm.py: nor
   dropout, nor buffers other than BatchNorm's); the optimizers' and frozen parameters are theirs;
4. each lane's `loss_of` is lane 0's function, closing over the same objects but its own Work and method copy
   (same `lane_group`), and over no module or tensor;
5. other Work fields than modules, tensors (a tensor, or a tuple / list / dict of them) and scalars equal on every
   client are a `Guard` in the loss, and any use of one refuses (`GuardedRead`);
6. every lane's Work and passes have lane 0's shape (field kinds, tensor shapes, passes, optimizers, parameters);
7. the loss runs under `torch.func.vmap` and `grad` (runtime.py turns a failure into the refusal).

Anything else is refused with one ConfigError naming `run.runtime=inprocess` and the rule that failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map

from fedhet.algorithms.base import Algorithm, AnyAlgorithm
from fedhet.config import TrainConfig
from fedhet.core.contract import LocalPass, LossStep, Work
from fedhet.errors import LanesRefused
from fedhet.runtimes.batched.optim import TensorTree

KINDS = ("sgd", "adam", "adamw")
SCALARS = (int, float, str, bool, type(None))
LANED_TRAIN = ("lr", "momentum", "weight_decay", "local_epochs", "local_steps", "batch_size")
SERVER_SIDE = ("server_cfg", "server_opt")  # read by aggregation only, never by a client's fit


def lane_group(alg: AnyAlgorithm) -> tuple[object, ...]:
    """Copies of one method (`with_hparams`) whose clients may be lanes of one vectorized step share this key:
    the same objects built in `__init__` and the same settings, except the ones the runtime lanes (the local
    optimizer's lr / momentum / weight decay, the step count and batch size: `LANED_TRAIN`; the method's
    `capabilities.lane_params`, which its `start` puts into the Work as tensors) and the server's. Clients of
    copies with different keys are trained in separate groups."""
    neutral = TrainConfig()
    train = dataclasses.replace(alg.train_cfg, **{f: getattr(neutral, f) for f in LANED_TRAIN})
    params, laned = alg.params, alg.capabilities.lane_params
    fixed = [(f.name, getattr(params, f.name)) for f in dataclasses.fields(params) if f.name not in laned] \
        if dataclasses.is_dataclass(params) else [("params", params)]
    shared = sorted((k, id(v)) for k, v in vars(alg).items() if k not in ("train_cfg", "params", *SERVER_SIDE))
    return (type(alg), tuple(shared), repr(train), repr(fixed))


def refusal(method: str, why: str) -> LanesRefused:
    """The one error of a refused method: which rule failed, and the runtime to use instead."""
    return LanesRefused(f"method '{method}' cannot run on run.runtime=batched: {why} (rules: "
                       f"docs/runtimes_batched.md). Run it with run.runtime=inprocess.")


class GuardedRead(Exception):
    """The loss used a Work field that differs between clients and is neither a module nor tensors."""


# every way Python code can use a value; each refuses on a Guard (attribute reads go through __getattribute__)
_USES = ("bool len iter reversed contains getitem setitem delitem call hash eq ne lt le gt ge neg pos abs invert "
         "float int index complex round trunc floor ceil str format bytes enter exit fspath setattr delattr "
         "add sub mul matmul truediv floordiv mod divmod pow lshift rshift and or xor").split()
_BINARY = _USES[_USES.index("add"):]


class Guard:
    """Stands in for a per-client Work field during the vectorized loss (rule 5): any use of it (an attribute
    read, indexing, iteration, len, arithmetic, comparison, truth value, a call, `in`, ...) refuses."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattribute__(self, attr: str) -> Any:  # Any: object.__getattribute__'s signature (it always raises)
        raise _guarded_read(self, "reads", f".{attr}")

    def __repr__(self) -> str:
        return f"<guard of work.{object.__getattribute__(self, '_name')}>"


def _guarded_read(guard: Guard, verb: str, detail: str) -> GuardedRead:
    name = object.__getattribute__(guard, "_name")
    return GuardedRead(f"its loss {verb} work.{name}{detail}, and work.{name} is not a module, tensors (a tensor, "
                       "or a tuple / list / dict of tensors) or a scalar equal on every client, so it cannot be "
                       "re-routed per client (rule 5)")


def _refusing(op: str) -> Callable[..., NoReturn]:
    def use(self: Guard, *_: object) -> NoReturn:
        raise _guarded_read(self, "uses", f" ({op})")

    return use


for _op in _USES:
    setattr(Guard, f"__{_op}__", _refusing(_op))
for _op in _BINARY:
    setattr(Guard, f"__r{_op}__", _refusing(_op))
    setattr(Guard, f"__i{_op}__", _refusing(_op))


@dataclass
class LaneWork:
    """One sampled client's fit: its Work and passes, and copies taken right after `start` of every module field's
    state (`"field:name"` -> tensor) and of the tensors fields (field -> a tensor, or a tuple / list / dict of them)."""

    work: Work
    passes: list[LocalPass]
    states: dict[str, torch.Tensor] = field(default_factory=dict)
    tensors: dict[str, TensorTree] = field(default_factory=dict)


@dataclass
class Layout:
    """Lane 0's Work fields by kind, and the state key (`"field:name"`) of each of its modules' tensors."""

    modules: list[str]
    tensors: list[str]
    guarded: list[str]
    keys: dict[int, str]  # id(parameter or buffer) of lane 0's modules -> "field:name"


def is_tensors(value: object) -> bool:
    """A tensor, or a tuple / list / dict (nested) of tensors, with at least one: what the runtime re-routes."""
    if not isinstance(value, torch.Tensor | tuple | list | dict):
        return False
    leaves = tree_leaves(value)
    return bool(leaves) and all(isinstance(t, torch.Tensor) for t in leaves)


def is_constant(value: object) -> bool:
    """A scalar or an empty tuple / list / dict: left as it is in the vectorized loss when equal on every lane."""
    return isinstance(value, SCALARS) or (type(value) in (tuple, list, dict) and not value)


def named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A module's parameters, then its buffers, by name: the state the runtime stacks per lane."""
    return [*module.named_parameters(), *module.named_buffers()]


def tensors_kind(value: TensorTree) -> str:
    """The structure and the shapes of a tensors field (rule 6: equal on every lane)."""
    leaves, spec = tree_flatten(value)
    return f"tensors {spec} {[tuple(t.shape) for t in leaves]}"


def snapshot(work: Work, passes: list[LocalPass]) -> LaneWork:
    """Copy what `start` put in the Work (its modules may be reused buffers the next client's `start` overwrites)."""
    lane = LaneWork(work, passes)
    for f in dataclasses.fields(work):
        value = getattr(work, f.name)
        if isinstance(value, nn.Module):
            lane.states.update({f"{f.name}:{n}": t.detach().clone() for n, t in named_tensors(value)})
        elif is_tensors(value):
            lane.tensors[f.name] = tree_map(lambda t: t.detach().clone(), value)
    return lane


def shape_key(work: Work) -> tuple[tuple[str, str], ...]:
    """The kind of each Work field (module type, tensor shapes, None, other): clients with equal keys are
    trained together, so that a field set for some clients only (MOON's previous model) splits the chunk."""
    def kind(value: object) -> str:
        if isinstance(value, nn.Module):
            return f"module {type(value).__name__}"
        if is_tensors(value):
            return tensors_kind(value)
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
            if not all(is_tensors(v) for v in values) or len({tensors_kind(v) for v in values}) > 1:
                raise refusal(method, f"work.{f.name} has different structures or shapes on different clients "
                              "(rule 6)")
            out.tensors.append(f.name)
        elif any(isinstance(v, nn.Module) or is_tensors(v) for v in values):
            raise refusal(method, f"work.{f.name} is a module or tensor for some clients only (rule 6)")
        elif not all(is_constant(v) for v in values) or any(v != first for v in values):
            out.guarded.append(f.name)
    for name in out.modules:
        module: nn.Module = getattr(work0, name)
        if any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in module.modules()):
            raise refusal(method, f"work.{name} has hooks, which the vectorized forward cannot re-route (rule 3)")
        for n, t in named_tensors(module):
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
            if any(id(q) not in layout.keys for q in spec.params):
                raise refusal(method, f"pass '{p0.name}' trains parameters outside the Work's module fields (rule 3)")
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


def shape_of(lane: LaneWork, k: int, layout: Layout) -> tuple[object, ...]:
    """What must agree between lanes for pass `k`: stages, optimizers, trained / frozen / train-mode keys."""
    p = lane.passes[k]
    if not isinstance(p.step, LossStep):
        return ("opaque",)
    keys = {id(t): f"{name}:{n}" for name in layout.modules for n, t in named_tensors(getattr(lane.work, name))}
    optims = tuple((name, dataclasses.replace(spec, params=(), after_backward=None, lr=0.0, momentum=0.0,
                                              weight_decay=0.0),
                    tuple(keys.get(id(q)) for q in spec.params)) for name, spec in sorted(p.optimizers.items()))
    frozen = tuple(keys.get(id(q)) for q in p.frozen)
    modules = tuple(next((n for n in layout.modules if getattr(lane.work, n) is m), None) for m in p.modules)
    return (tuple(opt for _, opt in p.step.stages), optims, frozen, modules, p.report)


def same_function(f0: Any, fi: Any, work0: Work, worki: Work) -> bool:  # Any: functions, read by __code__
    """Rule 4: same code, same defaults, and closure cells holding the same objects except each lane's Work and
    its copy of the method (same `lane_group`)."""
    if f0 is fi:
        return True
    code = getattr(f0, "__code__", None)
    if code is None or code is not getattr(fi, "__code__", None) or f0.__defaults__ is not fi.__defaults__:
        return False
    cells0, cellsi = f0.__closure__ or (), fi.__closure__ or ()
    if len(cells0) != len(cellsi):
        return False
    pairs = [(a.cell_contents, b.cell_contents) for a, b in zip(cells0, cellsi, strict=True)]
    return all(a is b or (a is work0 and b is worki) or (isinstance(a, Algorithm) and isinstance(b, Algorithm)
                                                        and lane_group(a) == lane_group(b)) for a, b in pairs)
