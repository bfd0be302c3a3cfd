"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020): control variates against client drift.

Implements Algorithm 1 with option II for the client control variate:

    local step (K times):  y_i <- y_i - lr * (g_i(y_i) - c_i + c)
    c_i+ = c_i - c + (x - y_i) / (K * lr)                              (option II)
    client sends  dy_i = y_i - x  and  dc_i = c_i+ - c_i
    server:  x <- x + lr_g * mean_S(dy_i);   c <- c + (|S| / N) * mean_S(dc_i)

Messages: the broadcast carries the global model x (the model's own state-dict keys) and the server control
variate `c/<param>`; the reply carries `dy/<key>` for every state key and `dc/<param>` for every trainable
floating-point parameter (`reply_layout`). c_i is client state (`ScaffoldClientState.c`, zero before the client
first trains, as in the paper's initialisation c_i = 0, c = 0).

Choices where the paper is silent or that this implementation makes:
- Control variates exist only for trainable floating-point *parameters*; buffers (BatchNorm running statistics,
  counters) have none and are averaged as in FedAvg (their dy is applied like a parameter's).
- The server step x + lr_g * mean(dy) goes through the library's server optimizer on the pseudo-gradient
  -mean(dy): lr_g is `server.lr` (1.0 by default, the paper's global step size); server momentum / Adam, if
  configured, act on it as for FedAvgM / FedAdam. mean(dy) follows `server.aggregation` (weighted by example
  counts by default, like every method here; `uniform` is the paper's plain mean). The control-variate update
  always uses the plain mean over the sampled clients, which keeps c = mean_i c_i as in the paper.
- N (the total number of clients) is not known to the server before clients reply. It is, in this order: the
  Params field `num_clients` if set; else the `num_clients` scalar the clients put in their replies (their
  `ctx.num_clients`, the federation's size); else the number of distinct clients that have replied so far
  (exact from round 1 under full participation, converging to N under client sampling).
- K is the number of local mini-batch steps actually taken in the round, lr is `train.lr`.
- The paper assumes plain SGD. The correction (c - c_i) is added to the gradient after backward (the pass's
  `OptimSpec.after_backward`, built in `start`); weight decay, momentum (if train.momentum > 0) and gradient
  clipping then act on the corrected gradient, and option II's (x - y_i) / (K lr) is then an average of the
  applied updates, not of raw gradients. `train.optimizer=adam` is rejected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhet.algorithms.base import Algorithm, ArraySpec, Capabilities, spec_of
from fedhet.algorithms.registry import register
from fedhet.core.aggregation import average, client_weights
from fedhet.core.contract import (
    ClientContext,
    ClientState,
    FitStats,
    LocalPass,
    OptimSpec,
    RoundInfo,
    ServerState,
    Work,
    minimize,
)
from fedhet.core.messages import Message, Reply, Scalar
from fedhet.core.params import StateDict, state_of
from fedhet.errors import ConfigError

C, DY, DC = "c/", "dy/", "dc/"


@dataclass(kw_only=True)
class ScaffoldServerState(ServerState):
    """The global model x, the server control variate c and the ids of the clients that have replied so far."""

    c: StateDict = field(default_factory=dict)
    seen: tuple[int, ...] = ()


@dataclass(kw_only=True)
class ScaffoldClientState(ClientState):
    """The client control variate c_i (empty: zero, before the client first trains)."""

    c: StateDict = field(default_factory=dict)


@dataclass(kw_only=True)
class ScaffoldWork(Work):
    """The fit's model, the client's c_i at the start of the round and the gradient correction c - c_i."""

    c_i: StateDict
    correct: Callable[[], None]


@dataclass
class ScaffoldParams:
    """num_clients: N in c <- c + |S|/N mean(dc); None = as the clients report it (module doc).
    control_lr, control_decay: a step size on the control-variate update, decayed per round,
    c <- c + control_lr * control_decay^(r-1) * |S|/N mean(dc) (1.0 and 1.0: the paper's update; the FedEx /
    FedPop search spaces tune them as "lr_control" and "gamma_control")."""

    num_clients: int | None = None
    control_lr: float = 1.0
    control_decay: float = 1.0

    def validate(self) -> None:
        if self.num_clients is not None and self.num_clients < 1:
            raise ConfigError(f"scaffold: num_clients must be >= 1 or null, got {self.num_clients}")
        if not self.control_lr > 0 or not 0 < self.control_decay <= 1:
            raise ConfigError(f"scaffold: control_lr must be > 0 and control_decay in (0, 1], got "
                              f"{self.control_lr} and {self.control_decay}")


@register
class Scaffold(Algorithm[ScaffoldServerState, ScaffoldClientState, ScaffoldWork, ScaffoldParams]):
    """FedAvg plus server and client control variates that correct every local gradient step."""

    name = "scaffold"
    server_state_type = ScaffoldServerState
    client_state_type = ScaffoldClientState
    work_type = ScaffoldWork
    capabilities = Capabilities(call_params=frozenset({"control_lr", "control_decay"}))  # read in `aggregate` only
    Params = ScaffoldParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: forwarded to Algorithm.__init__
        super().__init__(*args, **kwargs)
        if self.train_cfg.optimizer != "sgd":
            raise ConfigError("scaffold assumes local SGD (Karimireddy et al. 2020, Alg. 1); set train.optimizer=sgd")
        self.controlled = self.parts.trainable

    def zeros(self) -> StateDict:
        """A zero control variate (one tensor per controlled parameter)."""
        return self.parts.zeros(self.controlled)

    # ------------------------------------------------------------------ server side
    def init_server(self) -> ScaffoldServerState:
        """x = the initial model, c = 0, no client seen."""
        return dataclasses.replace(super().init_server(), c=self.zeros())

    def broadcast(self, server: ScaffoldServerState, info: RoundInfo, client_id: int) -> Message:
        """x and c (as `c/<param>`)."""
        return Message(arrays={**server.model, **{C + k: v for k, v in server.c.items()}})

    def reply_layout(self, broadcast: Message) -> dict[str, ArraySpec]:
        """`dy/<key>` for each model key, `dc/<param>` for each control variate `c/<param>` of the broadcast."""
        spec = spec_of(broadcast.arrays)
        return {**{DY + k: s for k, s in spec.items() if not k.startswith(C)},
                **{DC + k[len(C):]: s for k, s in spec.items() if k.startswith(C)}}

    def aggregate(self, server: ScaffoldServerState, replies: list[Reply], info: RoundInfo) -> ScaffoldServerState:
        """x <- x + lr_g mean(dy) (server optimizer); c <- c + |S|/N mean(dc) (plain mean)."""
        x = server.model
        weights = client_weights([r.num_examples for r in replies], self.server_cfg.aggregation)
        mean_dy = average([{k: r.message.arrays[DY + k] for k in x} for r in replies], weights)
        new_global, opt_state = self.server_opt.step(x, {k: x[k] + mean_dy[k] for k in x}, server.opt)
        mean_dc = average([{k: r.message.arrays[DC + k] for k in self.controlled} for r in replies],
                          [1.0] * len(replies))
        seen = tuple(sorted({*server.seen, *(r.client_id for r in replies)}))
        reported = [int(r.message.scalars["num_clients"]) for r in replies if "num_clients" in r.message.scalars]
        n_total = self.params.num_clients or max(reported, default=0) or len(seen)
        step = self.params.control_lr * self.params.control_decay ** (info.round - 1)
        scale = step * len(replies) / max(n_total, len(replies))
        c = {k: v + scale * mean_dc[k] for k, v in server.c.items()}
        return dataclasses.replace(server, model=new_global, opt=opt_state, c=c, seen=seen)

    # ------------------------------------------------------------------ client side
    def start(self, msg: Message, state: ScaffoldClientState, ctx: ClientContext) -> ScaffoldWork:
        """The received model, c_i, and the gradient edit that adds c - c_i after every backward pass."""
        model = self.client_model(msg, state)
        c_i = state.c or self.zeros()
        params = dict(model.named_parameters())
        correction = {k: (msg.arrays[C + k] - c_i[k]).to(ctx.device) for k in self.controlled}

        def correct() -> None:
            for k, corr in correction.items():
                grad = params[k].grad
                if grad is not None:
                    grad.add_(corr)

        return ScaffoldWork(msg=msg, ctx=ctx, model=model, c_i=c_i, correct=correct)

    def passes(self, work: ScaffoldWork) -> list[LocalPass]:
        """FedAvg's local SGD, each gradient corrected by c - c_i before the step."""
        cfg = self.train_cfg
        spec = OptimSpec.from_train(list(work.model.parameters()), cfg, after_backward=work.correct)
        return [LocalPass("local", minimize(lambda x, y: self.loss(work, x, y)), {"model": spec}, cfg,
                          modules=(work.model,))]

    def finish(self, work: ScaffoldWork, state: ScaffoldClientState, stats: FitStats
               ) -> tuple[Message, ScaffoldClientState]:
        """Option II: c_i+ = c_i - c + (x - y_i) / (K lr); reply dy = y_i - x and dc = c_i+ - c_i."""
        msg, c_i = work.msg, work.c_i
        y = state_of(work.model)
        x = {k: msg.arrays[k] for k in y}
        dc: StateDict = {}
        if stats.steps > 0:
            for k in self.controlled:
                c_new = c_i[k] - msg.arrays[C + k] + (x[k] - y[k]) / (stats.steps * self.train_cfg.lr)
                dc[k] = c_new - c_i[k]
        else:  # no data, no step: nothing changes
            dc = {k: torch.zeros_like(v) for k, v in c_i.items()}
        arrays = {**{DY + k: y[k] - x[k] for k in y}, **{DC + k: v for k, v in dc.items()}}
        scalars: dict[str, Scalar] = {"train_loss": stats.loss, "steps": stats.steps,
                                      "num_clients": work.ctx.num_clients}
        return Message(arrays=arrays, scalars=scalars), dataclasses.replace(
            state, c={k: c_i[k] + dc[k] for k in self.controlled})
