"""Functional local optimizers: torch.optim.SGD / Adam / AdamW updates as pure functions over tensor dicts.

`update(params, grads, state) -> (params, state)` never mutates its inputs, so it runs per client under
`torch.func.vmap` (or directly on client-stacked tensors: every per-client scalar, e.g. Adam's step count,
broadcasts over the trailing dimensions). With `donate=True` (JAX's buffer donation) the caller hands over the
parameter and state tensors and they are updated in place, as torch.optim does: the same arithmetic, without
allocating a new copy of every parameter each step (lanes.py donates when every lane takes the step).
The arithmetic follows torch.optim's single-tensor code path operation by operation (torch 2.x,
`foreach=False`, the CPU default), so results agree to float rounding:

- SGD (`torch.optim.SGD`, Sutskever et al. 2013 momentum form): g <- g + wd * p; on the first step the
  momentum buffer is a copy of g (torch's `buf is None` branch, which skips dampening), afterwards
  buf <- momentum * buf + (1 - dampening) * g; nesterov: g <- g + momentum * buf, else g <- buf; p <- p - lr * g.
- Adam (`torch.optim.Adam`, Kingma & Ba 2015, L2 weight decay added to the gradient) and AdamW
  (`torch.optim.AdamW`, Loshchilov & Hutter 2019: p <- p * (1 - lr * wd) before the Adam step).
- `clip_grad_norm` is `torch.nn.utils.clip_grad_norm_` (total 2-norm, coefficient max_norm / (norm + 1e-6)
  clamped at 1).

Per-lane hyperparameters (FedPop's members and local vectors as lanes, docs/design_fedpop_runner.md §4): when
lanes differ in lr / momentum / weight decay, `for_lanes` puts them in the state's slot `"hp"` (one value per
lane, carried through vmap, gathers and checkpoints like any other state) and the optimizer's own fields then
only say which terms exist (momentum buffers, a decay term); a lane with momentum 0 takes 0 * buf + g == g.
The per-lane arithmetic is `p - lr * g` rather than torch's fused `add(alpha=-lr)`, so it agrees with torch.optim
to float rounding (tests: 1e-6), not bit for bit; lanes that share their values keep the exact scalar path.

The state holds a per-client `step` count: a client that sits out a step keeps its old state (see lanes.py),
so clients may have taken different numbers of steps. `to_torch` / `from_torch` convert one client's state
to and from `torch.optim.Optimizer.state_dict()` format (parameters indexed in `params` order), so a
persisted optimizer state (`train.persist_optimizer`) moves freely between this runtime and the in-process one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from fedhet.config import TrainConfig
from fedhet.core.contract import OptimSpec
from fedhet.core.params import OptimState

Tensors = dict[str, torch.Tensor]
TensorTree = Any  # Any: a tensor, or a nested tuple / list / dict of tensors (a torch pytree)
OptState = dict[str, Tensors]  # slot -> parameter name -> tensor; slot "step" maps "" -> count
HP = "hp"  # the slot of per-lane hyperparameters: name -> one value per lane (float64)
Scalar = float | torch.Tensor


def _axpy(y: torch.Tensor, a: Scalar, x: torch.Tensor, donate: bool = False) -> torch.Tensor:
    """y + a * x: torch's fused `add(alpha=a)` for a Python float, `y + a * x` for a per-lane tensor."""
    if isinstance(a, float):
        return y.add_(x, alpha=a) if donate else y.add(x, alpha=a)
    return y.add_(a * x) if donate else y + a * x


def _hp(state: OptState, name: str, default: float, like: torch.Tensor) -> Scalar:
    """The lane's value of hyperparameter `name` (broadcastable against `like`), or the optimizer's own float."""
    hp = state.get(HP)
    return default if hp is None else expand_lanes(hp[name], like).to(like.dtype)


def expand_lanes(scalar: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-client scalar (shape S) viewed as S + (1,) * k so that it broadcasts against `like`."""
    return scalar.reshape(scalar.shape + (1,) * (like.dim() - scalar.dim()))


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD(lr, momentum, dampening, weight_decay, nesterov) as a pure function."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def init(self, params: Tensors, step_shape: tuple[int, ...] = (), hp: Tensors | None = None) -> OptState:
        """Fresh state: zero buffers (unused until the first step), step count 0 per client, and the per-lane
        hyperparameters `hp` if given."""
        ref = next(iter(params.values()))
        state: OptState = {"step": {"": torch.zeros(step_shape, dtype=torch.float32, device=ref.device)}}
        if self.momentum != 0:
            state["momentum_buffer"] = {k: torch.zeros_like(v) for k, v in params.items()}
        if hp is not None:
            state[HP] = hp
        return state

    def update(self, params: Tensors, grads: Tensors, state: OptState, donate: bool = False
               ) -> tuple[Tensors, OptState]:
        """One SGD step; returns new parameters and state. Inputs are untouched unless `donate`: then the
        parameters and buffers are updated in place (as torch.optim does) and returned."""
        step = state["step"][""]
        new_p: Tensors = {}
        new_buf: Tensors = {}
        for k, p in params.items():
            g = grads[k]
            lr, momentum = _hp(state, "lr", self.lr, p), _hp(state, "momentum", self.momentum, p)
            if self.weight_decay != 0:
                g = _axpy(g, _hp(state, "weight_decay", self.weight_decay, p), p)
            if self.momentum != 0:
                old = state["momentum_buffer"][k]
                buf = (old.mul_(momentum) if donate else old.mul(momentum)).add_(g, alpha=1 - self.dampening)
                if self.dampening != 0:  # torch's first step copies the gradient (with dampening 0, 0 * m + g = g)
                    buf = torch.where(expand_lanes(step, p) > 0, buf, g)
                new_buf[k] = buf
                g = _axpy(g, momentum, buf) if self.nesterov else buf
            new_p[k] = _axpy(p, -lr, g, donate)
        new_state: OptState = {"step": {"": step + 1}}
        if self.momentum != 0:
            new_state["momentum_buffer"] = new_buf
        if HP in state:
            new_state[HP] = state[HP]
        return new_p, new_state

    def to_torch(self, state: OptState, names: list[str]) -> OptimState:
        """One client's state as `torch.optim.SGD.state_dict()` (no entries before the first step), with the
        client's own values where they are per lane."""
        own = _own(self, state)
        entries: dict[int, dict[str, torch.Tensor]] = {}
        if own.momentum != 0 and float(state["step"][""]) > 0:
            entries = {i: {"momentum_buffer": state["momentum_buffer"][k].clone()} for i, k in enumerate(names)}
        group = {"lr": own.lr, "momentum": own.momentum, "dampening": self.dampening,
                 "weight_decay": own.weight_decay, "nesterov": self.nesterov, "maximize": False, "foreach": None,
                 "differentiable": False, "fused": None, "params": list(range(len(names)))}
        return {"state": entries, "param_groups": [group]}

    def from_torch(self, saved: OptimState, params: Tensors, hp: Tensors | None = None) -> OptState:
        """One client's state from a `torch.optim.SGD.state_dict()` over `params` (in order)."""
        state = self.init(params, hp=hp)
        entries = saved.get("state", {})
        if self.momentum != 0 and entries and "momentum_buffer" in entries[0]:
            state["momentum_buffer"] = {k: entries[i]["momentum_buffer"].detach().clone().to(p)
                                        for i, (k, p) in enumerate(params.items())}
            state["step"][""] = torch.ones((), device=next(iter(params.values())).device)
        return state


@dataclass(frozen=True)
class Adam:
    """torch.optim.Adam (L2 weight decay) or, with `decoupled`, torch.optim.AdamW, as a pure function."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def init(self, params: Tensors, step_shape: tuple[int, ...] = (), hp: Tensors | None = None) -> OptState:
        """Fresh state: zero moments, step count 0 per client, and the per-lane hyperparameters `hp` if given."""
        ref = next(iter(params.values()))
        state = {"step": {"": torch.zeros(step_shape, dtype=torch.float32, device=ref.device)},
                 "exp_avg": {k: torch.zeros_like(v) for k, v in params.items()},
                 "exp_avg_sq": {k: torch.zeros_like(v) for k, v in params.items()}}
        if hp is not None:
            state[HP] = hp
        return state

    def update(self, params: Tensors, grads: Tensors, state: OptState, donate: bool = False
               ) -> tuple[Tensors, OptState]:
        """One Adam(W) step; returns new parameters and state (inputs untouched unless `donate`, see SGD)."""
        beta1, beta2 = self.betas
        step = state["step"][""] + 1
        t = step.to(torch.float64)  # torch computes the bias corrections in Python (double) floats
        bias1 = 1 - beta1 ** t
        bias2_sqrt = (1 - beta2 ** t).sqrt()
        new_p: Tensors = {}
        new_m: Tensors = {}
        new_v: Tensors = {}
        hp = state.get(HP)
        lr: Scalar = self.lr if hp is None else hp["lr"]  # per lane: float64, as torch's Python step size
        for k, p in params.items():
            g = grads[k]
            if self.weight_decay != 0:
                wd = _hp(state, "weight_decay", self.weight_decay, p)
                if self.decoupled:
                    shrink = 1 - _hp(state, "lr", self.lr, p) * wd
                    p = p.mul_(shrink) if donate else p.mul(shrink)
                else:
                    g = _axpy(g, wd, p)
            # the moments are updated out of place even when donated: vmap has no batching rule for lerp_/addcmul_
            m = state["exp_avg"][k].lerp(g, 1 - beta1)
            v = state["exp_avg_sq"][k].mul(beta2).addcmul(g, g, value=1 - beta2)
            denom = (v.sqrt() / expand_lanes(bias2_sqrt, p).to(p.dtype)).add_(self.eps)
            update = expand_lanes(-lr / bias1, p).to(p.dtype) * m / denom  # torch: addcdiv(value=-step_size)
            new_p[k] = p.add_(update) if donate else p + update
            new_m[k], new_v[k] = m, v
        new_state = {"step": {"": step}, "exp_avg": new_m, "exp_avg_sq": new_v}
        if hp is not None:
            new_state[HP] = hp
        return new_p, new_state

    def to_torch(self, state: OptState, names: list[str]) -> OptimState:
        """One client's state as `torch.optim.Adam(W).state_dict()` (no entries before the first step), with the
        client's own values where they are per lane."""
        own = _own(self, state)
        step = state["step"][""]
        entries: dict[int, dict[str, torch.Tensor]] = {}
        if float(step) > 0:
            entries = {i: {"step": step.detach().to("cpu", torch.float32).clone(),
                           "exp_avg": state["exp_avg"][k].clone(), "exp_avg_sq": state["exp_avg_sq"][k].clone()}
                       for i, k in enumerate(names)}
        group = {"lr": own.lr, "betas": self.betas, "eps": self.eps, "weight_decay": own.weight_decay,
                 "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                 "fused": None, "decoupled_weight_decay": self.decoupled, "params": list(range(len(names)))}
        return {"state": entries, "param_groups": [group]}

    def from_torch(self, saved: OptimState, params: Tensors, hp: Tensors | None = None) -> OptState:
        """One client's state from a `torch.optim.Adam(W).state_dict()` over `params` (in order)."""
        state = self.init(params, hp=hp)
        entries = saved.get("state", {})
        if entries:
            for i, (k, p) in enumerate(params.items()):
                state["exp_avg"][k] = entries[i]["exp_avg"].detach().clone().to(p)
                state["exp_avg_sq"][k] = entries[i]["exp_avg_sq"].detach().clone().to(p)
            state["step"][""] = torch.as_tensor(entries[0]["step"], dtype=torch.float32).clone().to(p.device)
        return state


FunctionalOptimizer = SGD | Adam


def optimizer_for(cfg: TrainConfig, lr: float | None = None) -> FunctionalOptimizer:
    """The functional twin of `core.optim.make_optimizer(cfg)`: same algorithm and hyperparameters."""
    lr = cfg.lr if lr is None else lr
    if cfg.optimizer == "adam":
        return Adam(lr=lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return Adam(lr=lr, weight_decay=cfg.weight_decay, decoupled=True)
    return SGD(lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def optimizer_of(spec: OptimSpec) -> FunctionalOptimizer:
    """The functional twin of `core.optim.build_optimizer(spec)`: same algorithm and hyperparameters."""
    if spec.kind == "adam":
        return Adam(lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.kind == "adamw":
        return Adam(lr=spec.lr, weight_decay=spec.weight_decay, decoupled=True)
    return SGD(lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


LANED = ("lr", "momentum", "weight_decay")  # what may differ between lanes of one optimizer


def for_lanes(specs: Sequence[OptimSpec]) -> tuple[FunctionalOptimizer, Tensors | None]:
    """The functional optimizer of lanes whose specs differ at most in `LANED` values, and their per-lane values
    (slot "hp", one float64 per lane) when they differ; (`optimizer_of(spec)`, None) when all lanes agree."""
    first = optimizer_of(specs[0])
    if all((s.lr, s.momentum, s.weight_decay) == (specs[0].lr, specs[0].momentum, specs[0].weight_decay)
           for s in specs):
        return first, None
    names = LANED if isinstance(first, SGD) else ("lr", "weight_decay")
    hp = {n: torch.tensor([float(getattr(s, n)) for s in specs], dtype=torch.float64) for n in names}
    present: dict[str, Any] = {  # Any: **kwargs of replace(), whose fields mypy types one by one; terms that exist
        n: float(bool(hp[n].ne(0).any())) for n in names if n != "lr"}
    return dataclasses.replace(first, **present), hp


O = TypeVar("O", "SGD", "Adam")


def _own(fn: O, state: OptState) -> O:
    """`fn` with one client's per-lane values (its state's 0-dim "hp" entries) as its own fields."""
    hp = state.get(HP)
    values: dict[str, Any] = (  # Any: **kwargs of replace(), as in for_lanes
        {} if hp is None else {n: float(v) for n, v in hp.items()})
    return dataclasses.replace(fn, **values)


def clip_grad_norm(grads: Tensors, max_norm: float) -> Tensors:
    """`torch.nn.utils.clip_grad_norm_` as a pure function: scale all gradients by
    min(1, max_norm / (total 2-norm + 1e-6))."""
    norms = [torch.linalg.vector_norm(g, 2) for g in grads.values()]
    total = torch.linalg.vector_norm(torch.stack(norms), 2)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return {k: g * coef for k, g in grads.items()}
