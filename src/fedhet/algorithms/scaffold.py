"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020): control variates against client drift.

Implements Algorithm 1 with option II for the client control variate:

    local step (K times):  y_i <- y_i - lr * (g_i(y_i) - c_i + c)
    c_i+ = c_i - c + (x - y_i) / (K * lr)                              (option II)
    client sends  dy_i = y_i - x  and  dc_i = c_i+ - c_i
    server:  x <- x + lr_g * mean_S(dy_i);   c <- c + (|S| / N) * mean_S(dc_i)

Messages: the broadcast carries the global model x (the model's own state-dict keys) and the server control
variate `c/<param>`; the reply carries `dy/<key>` for every state key and `dc/<param>` for every trainable
floating-point parameter. c_i is client state (`state["c"]`, zero before the client first trains, as in the
paper's initialisation c_i = 0, c = 0).

Choices where the paper is silent or that this implementation makes:
- Control variates exist only for trainable floating-point *parameters*; buffers (BatchNorm running statistics,
  counters) have none and are averaged as in FedAvg (their dy is applied like a parameter's).
- The server step x + lr_g * mean(dy) goes through the library's server optimizer on the pseudo-gradient
  -mean(dy): lr_g is `server.lr` (1.0 by default, the paper's global step size); server momentum / Adam, if
  configured, act on it as for FedAvgM / FedAdam. mean(dy) follows `server.aggregation` (weighted by example
  counts by default, like every method here; `uniform` is the paper's plain mean). The control-variate update
  always uses the plain mean over the sampled clients, which keeps c = mean_i c_i as in the paper.
- N (the total number of clients) is not known to the server before clients reply. It is, in this order: the
  Params field `num_clients` if set; else the `num_clients` scalar the clients put in their replies (from
  `ctx.extra["num_clients"]`, which the engine fills in); else the number of distinct clients that have replied
  so far (exact from round 1 under full participation, converging to N under client sampling).
- K is the number of local mini-batch steps actually taken in the round, lr is `train.lr`.
- The paper assumes plain SGD. The correction (c - c_i) is added to the gradient after backward; weight decay,
  momentum (if train.momentum > 0) and gradient clipping then act on the corrected gradient, and option II's
  (x - y_i) / (K lr) is then an average of the applied updates, not of raw gradients. `train.optimizer=adam`
  is rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from fedhet.algorithms.base import Algorithm, ClientContext, ClientState, ServerState
from fedhet.algorithms.registry import register
from fedhet.config import TrainConfig
from fedhet.engine.aggregation import average, client_weights
from fedhet.engine.local import TrainStats
from fedhet.engine.messages import Message, Reply
from fedhet.engine.params import StateDict, state_of
from fedhet.errors import ConfigError
from fedhet.models import SplitModel

C, DY, DC = "c/", "dy/", "dc/"


@register
class Scaffold(Algorithm):
    """FedAvg plus server and client control variates that correct every local gradient step."""

    name = "scaffold"

    @dataclass
    class Params:
        """num_clients: N in c <- c + |S|/N mean(dc); None = as the clients report it (module doc)."""

        num_clients: int | None = None

        def validate(self) -> None:
            if self.num_clients is not None and self.num_clients < 1:
                raise ConfigError(f"scaffold: num_clients must be >= 1 or null, got {self.num_clients}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.train_cfg.optimizer != "sgd":
            raise ConfigError("scaffold assumes local SGD (Karimireddy et al. 2020, Alg. 1); set train.optimizer=sgd")
        self._controlled = [k for k, p in self._template.named_parameters()
                            if p.requires_grad and p.is_floating_point()]

    def _zeros(self) -> StateDict:
        return {k: torch.zeros_like(self._init_state[k]) for k in self._controlled}

    # ------------------------------------------------------------------ server side
    def init_server(self) -> ServerState:
        return {**super().init_server(), "c": self._zeros(), "seen": torch.zeros(0, dtype=torch.long)}

    def broadcast(self, server: ServerState, rnd: int, client_id: int) -> Message:
        return Message(arrays={**server["global"], **{C + k: v for k, v in server["c"].items()}})

    def aggregate(self, server: ServerState, replies: list[Reply]) -> ServerState:
        x = server["global"]
        weights = client_weights([r.num_examples for r in replies], self.server_cfg.aggregation)
        mean_dy = average([{k: r.message.arrays[DY + k] for k in x} for r in replies], weights)
        new_global, opt_state = self.server_opt.step(x, {k: x[k] + mean_dy[k] for k in x}, server["opt"])
        mean_dc = average([{k: r.message.arrays[DC + k] for k in self._controlled} for r in replies],
                          [1.0] * len(replies))
        seen = torch.unique(torch.cat([server["seen"], torch.tensor([r.client_id for r in replies])]))
        reported = [int(r.message.scalars["num_clients"]) for r in replies if "num_clients" in r.message.scalars]
        n_total = self.params.num_clients or max(reported, default=0) or len(seen)
        scale = len(replies) / max(n_total, len(replies))
        c = {k: v + scale * mean_dc[k] for k, v in server["c"].items()}
        return {**server, "global": new_global, "opt": opt_state, "c": c, "seen": seen}

    # ------------------------------------------------------------------ client side
    def local_train(self, model: SplitModel, msg: Message, state: ClientState, ctx: ClientContext,
                    dataset: Dataset | None = None, train_cfg: TrainConfig | None = None,
                    after_backward: Callable[[], None] | None = None) -> TrainStats:
        """Local SGD whose gradient is corrected by (c - c_i) after every backward pass."""
        c_i = state.get("c") or self._zeros()
        params = dict(model.named_parameters())
        correction = {k: (msg.arrays[C + k] - c_i[k]).to(ctx.device) for k in self._controlled}

        def correct() -> None:
            for k, corr in correction.items():
                if params[k].grad is not None:
                    params[k].grad.add_(corr)

        return super().local_train(model, msg, state, ctx, dataset, train_cfg, after_backward=correct)

    def fit(self, msg: Message, state: ClientState, ctx: ClientContext) -> tuple[Message, ClientState]:
        state = dict(state)
        model = self.client_model(msg, state)
        stats = self.local_train(model, msg, state, ctx)
        y = state_of(model)
        x = {k: msg.arrays[k] for k in y}
        c_i = state.get("c") or self._zeros()
        dc: StateDict = {}
        if stats.steps > 0:  # option II: c_i+ = c_i - c + (x - y_i) / (K lr)
            for k in self._controlled:
                c_new = c_i[k] - msg.arrays[C + k] + (x[k] - y[k]) / (stats.steps * self.train_cfg.lr)
                dc[k] = c_new - c_i[k]
        else:  # no data, no step: nothing changes
            dc = {k: torch.zeros_like(v) for k, v in c_i.items()}
        state["c"] = {k: c_i[k] + dc[k] for k in self._controlled}
        arrays = {**{DY + k: y[k] - x[k] for k in y}, **{DC + k: v for k, v in dc.items()}}
        scalars = {"train_loss": stats.loss, "steps": stats.steps}
        if "num_clients" in ctx.extra:
            scalars["num_clients"] = int(ctx.extra["num_clients"])
        return Message(arrays=arrays, scalars=scalars), state
