"""The algorithm contract, with FedAvg (McMahan et al. 2017) as every default.

An algorithm is explicit state plus functions over it (fedjax's shape, Flower's vocabulary):

    server:  init_server() -> S;  broadcast(server, info, cid) -> Message;  aggregate(server, replies, info) -> S
    client:  init_client(cid) -> C
             start(msg, state, ctx) -> W            (fedjax client_init: the fit's working set)
             passes(work) -> [LocalPass]             (client_step: what each mini-batch step does)
             finish(work, state, stats) -> (Message, C)   (client_final: the reply and the new state)
             deploy(msg, state, ctx) -> Deployment   (the model the client would use)

S, C and W are the method's own dataclasses (`fedhet.core.contract`: ServerState, ClientState, Work), declared
in `server_state_type`, `client_state_type` and `work_type`; P is its hyperparameters (`Params`, a dataclass built
from `method_args`), so `self.params.x` is typed. What the runtimes may assume beyond the types is one
`Capabilities` value per method. The engine (fedhet.engine.local) owns the loop;
a method overrides only what differs from FedAvg, usually `shared_keys`, `loss` or `deploy`. Nothing of one
call is kept on the instance: `parts.spare` slots are reusable buffers whose contents are undefined between
calls (every caller loads all the weights it relies on). The model bookkeeping (initial model, shared and
local keys, spare buffers, the reply of the shared arrays) is `self.parts` (algorithms/model_parts.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn

from fedhet.algorithms.model_parts import ModelParts
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.aggregation import ServerOptimizer
from fedhet.core.contract import (
    ClientContext,
    ClientState,
    Deployment,
    FitStats,
    LocalPass,
    NovelModel,
    RoundInfo,
    ServerState,
    Work,
    loss_pass,
)
from fedhet.core.messages import Message, Reply
from fedhet.core.params import state_of
from fedhet.core.robust import aggregate_shared, refuse_own_aggregation
from fedhet.errors import ConfigError
from fedhet.losses.classification import cross_entropy
from fedhet.models import SplitModel

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound=ServerState)
C = TypeVar("C", bound=ClientState)
W = TypeVar("W", bound=Work)
P = TypeVar("P", bound="DataclassInstance")  # the method's Params dataclass
ArraySpec = tuple[tuple[int, ...], torch.dtype]
# what a method needs of model and data: "vision-language" (a transformer over (image, question) data),
# "focal-modulation" (a FocalNet backbone), "latent-diffusion" (image data and a diffusers LDM)
Modality = Literal["any", "vision-language", "focal-modulation", "latent-diffusion"]


@dataclass
class NoParams:
    """An algorithm without hyperparameters of its own."""


@dataclass(frozen=True)
class Capabilities:
    """What the runtimes and tools may assume of a method beyond its types; one value per method class.

    call_params: Params fields read only inside the hooks, so they may differ per call (`with_hparams`, tuning
    spaces; FedProx: mu). lane_params: those of them the local loss never reads through `self` (FedProx's `start`
    puts mu into the Work), so clients whose copies differ in them may share lanes of the batched runtime.
    loss_is_batch_mean: the local loss is a mean over the batch's samples plus terms that do not depend on the
    batch, so a batch's gradient is the size-weighted mean of its parts' (batched accumulation); None: probed
    (true for FedAvg's `loss` and `passes`, false where a class overrides either without declaring it).
    modality: what the method needs of model and data (tests pick a model it can train on)."""

    call_params: frozenset[str] = frozenset()
    lane_params: frozenset[str] = frozenset()
    loss_is_batch_mean: bool | None = None
    modality: Modality = "any"

    def __post_init__(self) -> None:
        if not self.lane_params <= self.call_params:
            raise ValueError(f"lane_params {sorted(self.lane_params - self.call_params)} must be call_params")


def spec_of(arrays: dict[str, torch.Tensor]) -> dict[str, ArraySpec]:
    """Names -> (shape, dtype) of a set of arrays."""
    return {k: (tuple(v.shape), v.dtype) for k, v in arrays.items()}


class Algorithm(Generic[S, C, W, P]):
    """The contract; every default is FedAvg's. Subclasses set the three state types and Params, and override a
    few hooks."""

    name: ClassVar[str] = "base"
    personalized: bool = False  # clients deploy their own model (evaluated per client; EmbeddingNoise: per instance)
    centralized: ClassVar[bool] = False  # trains on the union of the clients' data: engine/experiment.arrange
    one_shot: ClassVar[bool] = False  # one round only (FedBiP): build_experiment refuses rounds != 1
    requires: ClassVar[str] = ""  # what a user installs or runs first (an extra, a pretraining step): `fedhet methods`
    capabilities: ClassVar[Capabilities] = Capabilities()
    # its own `aggregate` still aggregates the model through FedAvg's (FedSFDA's students), so server.aggregation's
    # robust rules apply; any other method that overrides `aggregate` refuses them (core/robust.py)
    shared_aggregation: ClassVar[bool] = False
    server_state_type: type[S]
    client_state_type: type[C]
    work_type: type[W]
    Params: type[P]

    def __init__(self, params: P, model_fn: Callable[[], SplitModel], train: TrainConfig,
                 server: ServerConfig, num_classes: int, device: torch.device, num_clients: int = 0) -> None:
        """`num_clients`: the federation's size when the engine knows it (0: unknown, e.g. a config check)."""
        self.params = params
        self.num_clients = num_clients
        self.train_cfg = train
        self.server_cfg = server
        self.run_server_cfg = server  # as the run gave it (a method may derive its own server_cfg: FRAug)
        self.num_classes = num_classes
        self.device = device
        refuse_own_aggregation(self.name, server.aggregation, own_aggregate(self) and not self.shared_aggregation)
        template = model_fn().to(device)
        self.server_opt = ServerOptimizer(server, frozenset(name for name, _ in template.named_buffers()))
        self.parts = ModelParts(template, self.shared_keys(template))

    # ------------------------------------------------------------------ models
    def shared_keys(self, model: nn.Module) -> set[str]:
        """State-dict keys that are communicated and averaged. FedAvg: all parameters and buffers."""
        return set(model.state_dict())

    def client_model(self, msg: Message, state: ClientState, slot: str = "workspace") -> SplitModel:
        """The received model with the client's local part, fully loaded into the reused model of `slot` (another
        slot when one call needs a second copy: Fed-SFDA's teacher, pFedAvg's scratch copy)."""
        return self.parts.assemble(self.parts.spare(slot), msg.arrays, state.local)

    # ------------------------------------------------------------------ server side
    def init_server(self) -> S:
        """The shared part of the initial model and an empty server-optimizer state."""
        shared = {k: v.clone() for k, v in self.parts.init_state.items() if k in self.parts.shared}
        return self.server_state_type(model=shared)

    def broadcast(self, server: S, info: RoundInfo, client_id: int) -> Message:
        """What the server sends to a client before fit and evaluate."""
        return Message(arrays=server.model)

    def aggregate(self, server: S, replies: list[Reply], info: RoundInfo) -> S:
        """`server.aggregation` (weighted / uniform average, or a robust rule) of the clients' shared arrays,
        then the server optimizer."""
        if not self.parts.shared:
            return server
        averaged = aggregate_shared([{k: r.message.arrays[k] for k in server.model} for r in replies],
                                    [r.num_examples for r in replies], server.model, self.server_cfg)
        model, opt = self.server_opt.step(server.model, averaged, server.opt)
        return dataclasses.replace(server, model=model, opt=opt)

    def server_model(self, server: S) -> SplitModel:
        """A new model holding the global weights (pooled evaluation; a server that trains the model further)."""
        return self.parts.assemble(self.parts.new(), server.model, {})

    def reply_layout(self, broadcast: Message) -> dict[str, ArraySpec]:
        """Names, shapes and dtypes of the arrays a fit reply to `broadcast` carries (checked by the Flower
        server before aggregation; a dimension of -1 matches any size). FedAvg: the arrays it received."""
        return spec_of(broadcast.arrays)

    # ------------------------------------------------------------------ client side
    def init_client(self, client_id: int) -> C:
        """Per-client persistent state; empty until the client first trains."""
        return self.client_state_type()

    def start(self, msg: Message, state: C, ctx: ClientContext) -> W:
        """The fit's working set: the received model with the client's local part."""
        return self.work_type(msg=msg, ctx=ctx, model=self.client_model(msg, state))

    def loss(self, work: W, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective of the model being trained. FedAvg: cross-entropy."""
        return cross_entropy(work.model, x, y)

    def passes(self, work: W) -> list[LocalPass]:
        """The round's local training. FedAvg: one pass of the model on the loss."""
        return [loss_pass(work.model, lambda x, y: self.loss(work, x, y), self.train_cfg)]

    def finish(self, work: W, state: C, stats: FitStats) -> tuple[Message, C]:
        """Reply with the shared part; keep the local part."""
        local = state_of(work.model, self.parts.local_keys())
        return self.parts.reply(work.model, stats), dataclasses.replace(state, local=local)

    def deploy(self, msg: Message, state: C, ctx: ClientContext) -> Deployment:
        """The model this client would deploy: received shared part + its local part."""
        return Deployment(self.client_model(msg, state))

    def novel_model(self, server: S, ctx: ClientContext, part: str, trained: list[int]) -> NovelModel | None:
        """A held-out client's model to adapt (`ctx`: the client and its data), when this method has its own for
        `part` (engine/novel.py; AdaptFED: z_new through the hypernetwork); None: the engine's (the deployed
        model, `part` trainable). `trained`: the ids of the clients that took part in training."""
        return None


def own_aggregate(alg: Algorithm[Any, Any, Any, Any]) -> bool:  # Any: any method's types
    """Whether the method overrides `aggregate` (its own aggregation, not only the shared model's mean): robust
    rules (core/robust.py) and privacy.dp (engine/dp_run.py) refuse such methods."""
    return type(alg).aggregate is not Algorithm.aggregate


# a method looked up by name at run time (the registry, the engine's experiment): its four types are its own
AnyAlgorithm = Algorithm[Any, Any, Any, Any]  # Any: any method's own state, work and Params types


class ModelAlgorithm(Algorithm[ServerState, ClientState, Work, P]):
    """A method with FedAvg's state types: a shared model on the server, the local keys on the client."""

    server_state_type = ServerState
    client_state_type = ClientState
    work_type = Work


def with_hparams(alg: Algorithm[S, C, W, P], train: TrainConfig | None = None, server: ServerConfig | None = None,
                 params: P | None = None) -> Algorithm[S, C, W, P]:
    """A shallow copy of `alg` that trains and aggregates with other hyperparameters (FedPop's per-client beta^k
    and per-member alpha, docs/design_fedpop_runner.md). It shares everything built in `__init__` (the model
    bookkeeping and its spare buffers), so copies run one at a time. `params` may differ from `alg.params` only
    in `alg.capabilities.call_params`: the other fields were consumed when the method was built. `server` is the
    run's server settings: the fields the method set itself when it was built (FRAug's aggregation) stay its own."""
    if params is not None:
        changed = sorted(f.name for f in dataclasses.fields(params)
                         if getattr(params, f.name) != getattr(alg.params, f.name))
        fixed = [name for name in changed if name not in alg.capabilities.call_params]
        if fixed:
            per_call = ", ".join(sorted(alg.capabilities.call_params)) or "none"
            raise ConfigError(f"method '{alg.name}' reads method_args {fixed} when it is built, so a copy cannot "
                              f"take them (build the method with them: fedhet tune does, per member); per-call "
                              f"method_args: {per_call}")
    copy = alg.__class__.__new__(alg.__class__)
    copy.__dict__.update(alg.__dict__)
    copy.train_cfg = train or alg.train_cfg
    derived = {f.name: getattr(alg.server_cfg, f.name) for f in dataclasses.fields(alg.server_cfg)
               if getattr(alg.server_cfg, f.name) != getattr(alg.run_server_cfg, f.name)}
    copy.server_cfg = alg.server_cfg if server is None else dataclasses.replace(server, **derived)
    copy.server_opt = ServerOptimizer(copy.server_cfg, alg.server_opt.buffers)
    copy.params = alg.params if params is None else params
    return copy
