"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, AAAI 2022): federated prototype learning.

Implements Algorithm 1 with Eqs. 4-8: the networks never leave the clients; only class prototypes cross.

    client prototype (Eq. 4):  C_i^(j) = mean_{(x,y) in D_i, y=j} f_i(x)         (f = model.features)
    global prototype (Eq. 6):  Cbar^(j) = sum_{i in N_j} |D_i,j| C_i^(j) / sum_{i in N_j} |D_i,j|
    local loss (Eqs. 7-8):     CE(h(f(x)), y) + lam * MSE(f(x), Cbar^(y))

Messages: the broadcast carries `proto` (C x d) and `proto_count` (C, the number of examples behind each
global prototype; 0 = no global prototype for that class yet); the reply carries the client's own `proto`
and `proto_count` (its per-class training counts). Server state: `proto`, `proto_count`; client state: the
whole local model (`local`).

Choices where the paper is silent or that this implementation makes:
- Prototypes are computed after local training, with the model in eval mode, on the client's training data
  under the evaluation transform (`ctx.data.train_eval`), as the brief of this library asks; the official code
  averages the features seen during the last local epoch instead.
- Aggregation is weighted by per-class counts (Eq. 6 with the |D_i,j| weights); classes a client lacks are
  skipped; a class no replying client holds keeps its previous global prototype (partial participation).
- The regulariser follows the official code: MSE over all B x d entries of the batch, with samples of classes
  that have no global prototype contributing zero (their target is their own feature). Round 1 has no global
  prototypes, so the loss is plain CE.
- Inference: `inference="head"` (default) uses the client's own classifier; `"prototype"` predicts the class of
  the nearest global prototype in squared Euclidean distance (logits = -distance; classes without a global
  prototype get -inf, so they are never predicted), falling back to the head while no prototype exists.
- Evaluation runs in batches of 256 (`Deployment.batch_size`), whichever the inference, as this module always
  evaluated (not train.batch_size): the reported losses stay the same numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientContext, ClientState, Deployment, FitStats, RoundInfo, ServerState, Work
from fedhet.core.messages import Message, Reply
from fedhet.core.params import state_of
from fedhet.core.protocols import SampleSet
from fedhet.errors import ConfigError, FedhetError
from fedhet.models import SplitModel

INFERENCE = ("head", "prototype")
EVAL_BATCH_SIZE = 256  # the batch size FedProto always evaluated with (kept so the numbers stay the same)


def proto_regularizer(u: torch.Tensor, y: torch.Tensor, proto: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """MSE(f(x), Cbar^(y)) averaged over all B x d entries; samples whose class has no prototype add zero."""
    has = count[y] > 0
    target = torch.where(has[:, None], proto[y], u.detach())
    return F.mse_loss(u, target)


@torch.no_grad()
def class_prototypes(model: SplitModel, dataset: SampleSet, num_classes: int, device: torch.device,
                     batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean features (C x d, zero rows for absent classes) and per-class counts (C)."""
    model.eval()
    sums = torch.zeros(num_classes, model.feature_dim, dtype=torch.float64)
    counts = torch.zeros(num_classes, dtype=torch.float64)
    for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        u = model.features(x.to(device)).double().cpu()
        sums.index_add_(0, y, u)
        counts.index_add_(0, y, torch.ones(len(y), dtype=torch.float64))
    protos = sums / counts.clamp_min(1)[:, None]
    return protos.float(), counts.float()


class PrototypeClassifier(nn.Module):
    """logits_j = -||f(x) - Cbar^(j)||^2 for classes with a global prototype, -inf otherwise."""

    def __init__(self, model: SplitModel, proto: torch.Tensor, count: torch.Tensor) -> None:
        super().__init__()
        self.model, self.proto, self.valid = model, proto, count > 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.model.features(x)
        proto = self.proto.to(u.device, u.dtype)
        logits = -torch.cdist(u, proto).pow(2)
        return logits.masked_fill(~self.valid.to(u.device), float("-inf"))


@dataclass
class FedProtoParams:
    """lam: weight of the prototype regulariser; inference: 'head' or nearest 'prototype'."""

    lam: float = 1.0
    inference: str = "head"

    def validate(self) -> None:
        if not self.lam >= 0:
            raise ConfigError(f"fedproto: lam must be >= 0, got {self.lam}")
        if self.inference not in INFERENCE:
            raise ConfigError(f"fedproto: inference must be one of {', '.join(INFERENCE)}, "
                              f"got {self.inference!r}")


@dataclass(kw_only=True)
class ProtoServerState(ServerState):
    """The global prototypes (C x d) and the number of examples behind each (C; 0: none yet)."""

    proto: torch.Tensor
    proto_count: torch.Tensor


@dataclass(kw_only=True)
class ProtoWork(Work):
    """The local model and the received global prototypes and counts, on the client's device."""

    model: SplitModel
    proto: torch.Tensor
    proto_count: torch.Tensor


def received(msg: Message) -> tuple[torch.Tensor, torch.Tensor]:
    """The global prototypes and counts a FedProto message carries."""
    if "proto" not in msg.arrays or "proto_count" not in msg.arrays:
        raise FedhetError(f"fedproto: the message carries no global prototypes (arrays: {sorted(msg.arrays)})")
    return msg.arrays["proto"], msg.arrays["proto_count"]


@register
class FedProto(Algorithm[ProtoServerState, ClientState, ProtoWork, FedProtoParams]):
    """Fully local models regularised towards count-weighted global class prototypes."""

    name = "fedproto"
    personalized = True
    Params = FedProtoParams
    capabilities = Capabilities(call_params=frozenset({"lam", "inference"}))  # read in `loss` / `deploy` only
    server_state_type = ProtoServerState
    client_state_type = ClientState
    work_type = ProtoWork

    def shared_keys(self, model: nn.Module) -> set[str]:
        return set()  # nothing of the network is communicated

    # ------------------------------------------------------------------ server side
    def init_server(self) -> ProtoServerState:
        """No global prototype yet: zero prototypes with zero counts."""
        d = self.parts.template.feature_dim
        return ProtoServerState(proto=torch.zeros(self.num_classes, d), proto_count=torch.zeros(self.num_classes))

    def broadcast(self, server: ProtoServerState, info: RoundInfo, client_id: int) -> Message:
        return Message(arrays={"proto": server.proto, "proto_count": server.proto_count})

    def aggregate(self, server: ProtoServerState, replies: list[Reply], info: RoundInfo) -> ProtoServerState:
        """Eq. 6: per class, the count-weighted mean of the clients' prototypes (classes with count 0 skipped)."""
        counts = torch.stack([r.message.arrays["proto_count"].double() for r in replies])  # (K, C)
        protos = torch.stack([r.message.arrays["proto"].double() for r in replies])  # (K, C, d)
        total = counts.sum(0)
        mean = (counts[:, :, None] * protos).sum(0) / total.clamp_min(1)[:, None]
        present = total > 0
        proto = torch.where(present[:, None], mean.float(), server.proto)
        count = torch.where(present, total.float(), server.proto_count)
        return dataclasses.replace(server, proto=proto, proto_count=count)

    # ------------------------------------------------------------------ client side
    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> ProtoWork:
        """The client's own model and the received global prototypes (moved to its device)."""
        proto, count = received(msg)
        return ProtoWork(msg=msg, ctx=ctx, model=self.client_model(msg, state), proto=proto.to(ctx.device),
                         proto_count=count.to(ctx.device))

    def loss(self, work: ProtoWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE + lam * MSE(f(x), Cbar^(y)) (Eqs. 7-8); plain CE while no global prototype exists."""
        u = work.model.features(x)
        ce = F.cross_entropy(work.model.head(u), y)
        if self.params.lam == 0 or not bool((work.proto_count > 0).any()):
            return ce
        return ce + self.params.lam * proto_regularizer(u, y, work.proto, work.proto_count)

    def finish(self, work: ProtoWork, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        """Keep the trained model; reply with its class prototypes on the training data (eval transform)."""
        new_state = dataclasses.replace(state, local=state_of(work.model, self.parts.local_keys()))
        data = work.ctx.data.train_eval if work.ctx.data.train_eval is not None else work.ctx.data.train
        proto, count = class_prototypes(work.model, data, self.num_classes, work.ctx.device)
        scalars = self.parts.reply(work.model, stats).scalars
        return Message(arrays={"proto": proto, "proto_count": count}, scalars=scalars), new_state

    def deploy(self, msg: Message, state: ClientState, ctx: ClientContext) -> Deployment:
        """The client's model (`inference="head"`), or nearest-global-prototype classification on its features
        (`"prototype"`, once a global prototype exists); evaluated in batches of 256 (EVAL_BATCH_SIZE)."""
        model = self.client_model(msg, state)
        proto, count = received(msg)
        if self.params.inference == "prototype" and bool((count > 0).any()):
            return Deployment(PrototypeClassifier(model, proto, count), batch_size=EVAL_BATCH_SIZE)
        return Deployment(model, batch_size=EVAL_BATCH_SIZE)
