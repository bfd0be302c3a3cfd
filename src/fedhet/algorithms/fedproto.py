"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, AAAI 2022): federated prototype learning.

Implements Algorithm 1 with Eqs. 4-8: the networks never leave the clients; only class prototypes cross.

    client prototype (Eq. 4):  C_i^(j) = mean_{(x,y) in D_i, y=j} f_i(x)         (f = model.features)
    global prototype (Eq. 6):  Cbar^(j) = sum_{i in N_j} |D_i,j| C_i^(j) / sum_{i in N_j} |D_i,j|
    local loss (Eqs. 7-8):     CE(h(f(x)), y) + lam * MSE(f(x), Cbar^(y))

Messages: the broadcast carries `proto` (C x d) and `proto_count` (C, the number of examples behind each
global prototype; 0 = no global prototype for that class yet); the reply carries the client's own `proto`
and `proto_count` (its per-class training counts). Client state: the whole local model (`state["local"]`).

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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from fedhet.algorithms.base import Algorithm, ClientContext, ClientState, ServerState
from fedhet.algorithms.registry import register
from fedhet.engine.local import TrainStats, evaluate
from fedhet.engine.messages import Message, Reply
from fedhet.errors import ConfigError
from fedhet.models import SplitModel

INFERENCE = ("head", "prototype")


def proto_regularizer(u: torch.Tensor, y: torch.Tensor, proto: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """MSE(f(x), Cbar^(y)) averaged over all B x d entries; samples whose class has no prototype add zero."""
    has = count[y] > 0
    target = torch.where(has[:, None], proto[y], u.detach())
    return F.mse_loss(u, target)


@torch.no_grad()
def class_prototypes(model: SplitModel, dataset: Dataset, num_classes: int, device: torch.device,
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


@register
class FedProto(Algorithm):
    """Fully local models regularised towards count-weighted global class prototypes."""

    name = "fedproto"
    personalized = True

    @dataclass
    class Params:
        """lam: weight of the prototype regulariser; inference: 'head' or nearest 'prototype'."""

        lam: float = 1.0
        inference: str = "head"

        def validate(self) -> None:
            if not self.lam >= 0:
                raise ConfigError(f"fedproto: lam must be >= 0, got {self.lam}")
            if self.inference not in INFERENCE:
                raise ConfigError(f"fedproto: inference must be one of {', '.join(INFERENCE)}, "
                                  f"got {self.inference!r}")

    def shared_keys(self, model: nn.Module) -> set[str]:
        return set()  # nothing of the network is communicated

    # ------------------------------------------------------------------ server side
    def init_server(self) -> ServerState:
        d = self._template.feature_dim
        return {"proto": torch.zeros(self.num_classes, d), "proto_count": torch.zeros(self.num_classes)}

    def broadcast(self, server: ServerState, rnd: int, client_id: int) -> Message:
        return Message(arrays={"proto": server["proto"], "proto_count": server["proto_count"]})

    def aggregate(self, server: ServerState, replies: list[Reply]) -> ServerState:
        """Eq. 6: per class, the count-weighted mean of the clients' prototypes (classes with count 0 skipped)."""
        counts = torch.stack([r.message.arrays["proto_count"].double() for r in replies])  # (K, C)
        protos = torch.stack([r.message.arrays["proto"].double() for r in replies])  # (K, C, d)
        total = counts.sum(0)
        mean = (counts[:, :, None] * protos).sum(0) / total.clamp_min(1)[:, None]
        present = total > 0
        proto = torch.where(present[:, None], mean.float(), server["proto"])
        count = torch.where(present, total.float(), server["proto_count"])
        return {**server, "proto": proto, "proto_count": count}

    # ------------------------------------------------------------------ client side
    def loss(self, model: SplitModel, x: torch.Tensor, y: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        u = model.features(x)
        ce = F.cross_entropy(model.head(u), y)
        proto, count = ctx.extra.get("proto"), ctx.extra.get("proto_count")
        if proto is None or count is None or self.params.lam == 0 or not bool((count > 0).any()):
            return ce
        return ce + self.params.lam * proto_regularizer(u, y, proto, count)

    def local_train(self, model: SplitModel, msg: Message, state: ClientState, ctx: ClientContext,
                    dataset: Dataset | None = None) -> TrainStats:
        """Train with the received global prototypes handed to `loss` through the round's context."""
        extra = {**ctx.extra, **{k: msg.arrays[k].to(ctx.device) for k in ("proto", "proto_count")
                                 if k in msg.arrays}}
        return super().local_train(model, msg, state, dataclasses.replace(ctx, extra=extra), dataset)

    def fit(self, msg: Message, state: ClientState, ctx: ClientContext) -> tuple[Message, ClientState]:
        reply, state = super().fit(msg, state, ctx)
        model = self.client_model(msg, state)  # the trained local model, reloaded from the new state
        data = ctx.data.train_eval if ctx.data.train_eval is not None else ctx.data.train
        proto, count = class_prototypes(model, data, self.num_classes, ctx.device)
        return Message(arrays={"proto": proto, "proto_count": count}, scalars=reply.scalars), state

    def evaluate(self, msg: Message, state: ClientState, ctx: ClientContext, dataset: Dataset) -> dict[str, float]:
        model = self.deploy_model(msg, state, ctx)
        count = msg.arrays.get("proto_count")
        if self.params.inference == "prototype" and count is not None and bool((count > 0).any()):
            model = PrototypeClassifier(model, msg.arrays["proto"], count)  # type: ignore[arg-type]
        return evaluate(model, dataset, ctx.device)
