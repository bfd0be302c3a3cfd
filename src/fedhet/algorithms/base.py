"""The algorithm interface every method implements, with FedAvg's behaviour as the default.

An algorithm is a set of pure-ish functions over explicit state (fedjax's shape, Flower's vocabulary):

    server:  init_server() -> ServerState; broadcast(server, round, cid) -> Message;
             aggregate(server, replies) -> ServerState
    client:  init_client(cid) -> ClientState; fit(msg, state, ctx) -> (Message, ClientState);
             evaluate(msg, state, ctx, dataset) -> metrics

States are plain dicts of tensors and numbers (saved in checkpoints, moved between runtimes); `Message`s
are the only thing that crosses between server and client. A method overrides only what differs from
FedAvg, usually `shared_keys` (what is communicated), `loss` (the local objective) or `deploy_model`
(the model a client would use, for personalized methods).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import Dataset

from fedhet.config import ServerConfig, TrainConfig
from fedhet.data import ClientData
from fedhet.engine.aggregation import ServerOptimizer, average, client_weights
from fedhet.engine.local import TrainStats, cross_entropy, evaluate, make_optimizer, train_local
from fedhet.engine.messages import Message, Reply
from fedhet.engine.params import StateDict, load_partial, state_of
from fedhet.models import SplitModel

ServerState = dict[str, Any]
ClientState = dict[str, Any]


@dataclass
class NoParams:
    """An algorithm without hyperparameters of its own."""


@dataclass
class ClientContext:
    """What a client knows while it trains or evaluates: who it is, which round, its data, its device."""

    client_id: int
    round: int
    data: ClientData
    device: torch.device
    num_classes: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PersonalStep:
    """A personal model v trained beside the global one (Ditto, Li et al. 2021, Alg. 1): local SGD on
    CE(v(x), y) + (lam/2)||v - w^t||^2, w^t the received model. `tandem`: one step of v after each step of w on
    the same batch; else the w pass, then a v pass of `train`'s local work on a fresh batch stream."""

    lam: float
    tandem: bool
    train: TrainConfig


@dataclass(frozen=True)
class BatchedStep:
    """A method's local training as data, for `run.runtime=batched` (runtimes/batched): `local_train` with the
    train config's optimizer on CE + (prox_mu/2)||w - w^t||^2 over the trainable parameters (w^t: the model at
    the start of the round), then `reply` and the local keys kept as in `fit`; plus `personal` (Ditto)."""

    prox_mu: float = 0.0
    personal: PersonalStep | None = None


class Algorithm:
    """FedAvg (McMahan et al. 2017) as the default behaviour of every hook; subclasses override a few."""

    name: ClassVar[str] = "base"
    Params: ClassVar[type] = NoParams
    personalized: ClassVar[bool] = False  # clients deploy their own model (evaluated per client)
    centralized: ClassVar[bool] = False  # trains one model on the union of the clients' data (oracle)

    def __init__(self, params: Any, model_fn: Callable[[], SplitModel], train: TrainConfig,
                 server: ServerConfig, num_classes: int, device: torch.device) -> None:
        self.params = params
        self.train_cfg = train
        self.server_cfg = server
        self.num_classes = num_classes
        self.device = device
        self._template = model_fn().to(device)
        self._spares: dict[str, SplitModel] = {}
        self.server_opt = ServerOptimizer(server)
        self._shared = self.shared_keys(self._template)
        self._init_state = state_of(self._template)

    # ------------------------------------------------------------------ models and state
    def new_model(self) -> SplitModel:
        """A fresh copy of the (seeded) initial model on the run's device."""
        return copy.deepcopy(self._template)

    def spare_model(self, slot: str) -> SplitModel:
        """A model object reused across calls and clients for `slot` (e.g. "workspace", "reference"): built once
        from the initial model; callers load every weight they rely on before use."""
        if slot not in self._spares:
            self._spares[slot] = self.new_model()
        return self._spares[slot]

    def shared_keys(self, model: nn.Module) -> set[str]:
        """State-dict keys that are communicated and averaged. FedAvg: all parameters and buffers."""
        return set(model.state_dict())

    @property
    def shared(self) -> set[str]:
        return self._shared

    def local_keys(self) -> set[str]:
        """Keys that never leave the client."""
        return set(self._init_state) - self._shared

    def assemble(self, model: nn.Module, msg: Message, state: ClientState) -> nn.Module:
        """Load into `model` every key: shared ones from the message, local ones from the client state
        (the initial model's values before the client has trained)."""
        local = state.get("local", {})
        load_partial(model, {k: local.get(k, self._init_state[k]) for k in self.local_keys()})
        load_partial(model, {k: v for k, v in msg.arrays.items() if k in self._init_state})
        return model

    def client_model(self, msg: Message, state: ClientState) -> SplitModel:
        """The client's working model for this round: a reused workspace (valid until the next call)."""
        return self.assemble(self.spare_model("workspace"), msg, state)  # type: ignore[return-value]

    # ------------------------------------------------------------------ server side
    def init_server(self) -> ServerState:
        """Global state: the shared part of the initial model and the server optimizer's state."""
        return {"global": {k: v.clone() for k, v in self._init_state.items() if k in self._shared}, "opt": {}}

    def broadcast(self, server: ServerState, rnd: int, client_id: int) -> Message:
        """What the server sends to a client before fit and evaluate."""
        return Message(arrays=server["global"])

    def aggregate(self, server: ServerState, replies: list[Reply]) -> ServerState:
        """Weighted (or uniform) average of the clients' shared arrays, then the server optimizer."""
        if not self._shared:
            return server
        weights = client_weights([r.num_examples for r in replies], self.server_cfg.aggregation)
        averaged = average([r.message.arrays for r in replies], weights)
        new_global, opt_state = self.server_opt.step(server["global"], averaged, server["opt"])
        return {**server, "global": new_global, "opt": opt_state}

    def server_model(self, server: ServerState) -> SplitModel:
        """The global model (for pooled evaluation of non-personalized methods)."""
        return self.assemble(self.new_model(), Message(arrays=server.get("global", {})), {})  # type: ignore

    # ------------------------------------------------------------------ client side
    def init_client(self, client_id: int) -> ClientState:
        """Per-client persistent state; empty until the client first trains."""
        return {}

    def loss(self, model: SplitModel, x: torch.Tensor, y: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        """The local objective. FedAvg: cross-entropy."""
        return cross_entropy(model, x, y)

    def local_train(self, model: SplitModel, msg: Message, state: ClientState, ctx: ClientContext,
                    dataset: Dataset | None = None, train_cfg: TrainConfig | None = None,
                    after_backward: Callable[[], None] | None = None) -> TrainStats:
        """One round of local SGD on the client's training data (or `dataset`) with `self.loss`;
        `after_backward` may edit the gradients before each optimizer step (SCAFFOLD's correction)."""
        cfg = train_cfg or self.train_cfg
        opt = make_optimizer(model.parameters(), cfg)
        if cfg.persist_optimizer and "optim" in state:
            opt.load_state_dict(copy.deepcopy(state["optim"]))  # torch aliases the loaded buffers
        stats = train_local(model, ctx.data.train if dataset is None else dataset, cfg, ctx.device,
                            loss_fn=lambda m, x, y: self.loss(m, x, y, ctx), optimizer=opt,
                            after_backward=after_backward,
                            where=f"{self.name} client {ctx.client_id} round {ctx.round}")
        if cfg.persist_optimizer:
            state["optim"] = copy.deepcopy(opt.state_dict())
        return stats

    def fit(self, msg: Message, state: ClientState, ctx: ClientContext) -> tuple[Message, ClientState]:
        """Train locally from the received model; reply with the shared part, keep the local part."""
        state = dict(state)
        model = self.client_model(msg, state)
        stats = self.local_train(model, msg, state, ctx)
        state["local"] = state_of(model, self.local_keys())
        return self.reply(model, stats), state

    def reply(self, model: nn.Module, stats: TrainStats) -> Message:
        """The fit reply: the shared arrays plus training scalars."""
        return Message(arrays=state_of(model, self._shared),
                       scalars={"train_loss": stats.loss, "steps": stats.steps})

    def deploy_model(self, msg: Message, state: ClientState, ctx: ClientContext) -> nn.Module:
        """The model this client would deploy: received shared part + its local part."""
        return self.client_model(msg, state)

    def batched_step(self) -> BatchedStep | None:
        """The local step for the batched runtime, or None: it cannot be batched. Only a class that defines
        this method itself is batched (an inherited declaration does not count: a subclass may change the step)."""
        return None

    def evaluate(self, msg: Message, state: ClientState, ctx: ClientContext, dataset: Dataset) -> dict[str, float]:
        """Metrics of the deployed model on one of the client's splits."""
        return evaluate(self.deploy_model(msg, state, ctx), dataset, ctx.device, batch_size=self.train_cfg.batch_size)


def shared_state(model: nn.Module, keys: set[str]) -> StateDict:
    """Convenience for subclasses: a detached CPU copy of the given keys."""
    return state_of(model, keys)
