"""MOON (Li, He, Song, CVPR 2021): model-contrastive federated learning.

Implements the local objective of Eqs. 3-4 (Algorithm 1); the server is FedAvg:

    l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )   (Eq. 3)
    loss  = CE(logits, y) + mu * l_con                                                              (Eq. 4)

with sim the cosine similarity, z the representation of the model being trained, z_glob that of the frozen
global model received this round and z_prev that of the client's own model at the end of its previous round
(the client state's `prev`, every state key of the model).

Choices where the paper is silent or that this implementation makes:
- Representation: by default z = model.features(x) (the SplitModel's feature extractor), with no projection
  head. With `projection_dim` set, a 2-layer MLP (Linear-ReLU-Linear, as in the paper's projection head) maps
  the features to z; it is part of the model, shared and averaged like every other weight. Unlike the paper,
  the classifier still reads the features, not the projection (the projection is a side branch for l_con only).
  Its initial weights come from a generator seeded by a hash of the initial model, so they follow the run seed.
- One previous model (the paper's default buffer size 1). In a client's first round there is no previous
  model, so the loss is CE only (the official code's previous model is the initial global model then, which
  makes l_con the constant log 2 with zero gradient: the same update).
- The frozen global and previous models run in eval mode (no gradient, BatchNorm running statistics), as in
  the official code.
- Defaults: mu = 1.0 (the paper's value for CIFAR-100 and Tiny-ImageNet; it uses 5 on CIFAR-10),
  temperature = 0.5 (the paper's value).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientContext, ClientState, FitStats, ServerState, Work
from fedhet.core.messages import Message
from fedhet.core.params import StateDict, load_partial, state_of
from fedhet.errors import ConfigError
from fedhet.models import SplitModel


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 3 averaged over the batch: cross-entropy of [sim(z, z_glob), sim(z, z_prev)] / tau with target 0."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], 1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class ProjectedModel(SplitModel):
    """A SplitModel with a projection head beside the classifier: forward = head(features(x))."""

    def __init__(self, base: SplitModel, projection_dim: int) -> None:
        super().__init__(base.features, base.head, base.feature_dim, base.num_classes)
        seed = int.from_bytes(hashlib.sha256(next(base.parameters()).detach().cpu().numpy().tobytes()).digest()[:7],
                              "little")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            d = base.feature_dim
            self.projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, projection_dim))
        self.projection.to(next(base.parameters()).device)


@dataclass
class MoonParams:
    """mu: weight of l_con; temperature: tau; projection_dim: size of an optional projection head."""

    mu: float = 1.0
    temperature: float = 0.5
    projection_dim: int | None = None

    def validate(self) -> None:
        if not self.mu >= 0:
            raise ConfigError(f"moon: mu must be >= 0, got {self.mu}")
        if not self.temperature > 0:
            raise ConfigError(f"moon: temperature must be > 0, got {self.temperature}")
        if self.projection_dim is not None and self.projection_dim < 1:
            raise ConfigError(f"moon: projection_dim must be >= 1 or null, got {self.projection_dim}")


@dataclass(kw_only=True)
class MoonState(ClientState):
    """The client's model at the end of its previous round (None before its first round)."""

    prev: StateDict | None = None


@dataclass(kw_only=True)
class MoonWork(Work):
    """The model being trained, the frozen global model received this round and the frozen previous local model
    (both None in the client's first round: the loss is then CE only)."""

    model: SplitModel
    glob: SplitModel | None = None
    prev: SplitModel | None = None


@register
class Moon(Algorithm[ServerState, MoonState, MoonWork, MoonParams]):
    """FedAvg whose local loss pulls z towards the global model's representation and away from the previous one."""

    name = "moon"
    Params = MoonParams
    capabilities = Capabilities(call_params=frozenset({"mu", "temperature"}))  # read in `loss` only
    server_state_type = ServerState
    client_state_type = MoonState
    work_type = MoonWork

    def __init__(self, params: MoonParams, model_fn: Callable[[], SplitModel],
                 *args: Any, **kwargs: Any) -> None:  # Any: forwarded to Algorithm.__init__
        dim = params.projection_dim
        build = model_fn if dim is None else (lambda: ProjectedModel(model_fn(), dim))
        super().__init__(params, build, *args, **kwargs)

    def represent(self, model: SplitModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, features u): z = projection(u) when the model has a projection head, else u."""
        u = model.features(x)
        return (model.projection(u) if isinstance(model, ProjectedModel) else u), u

    def frozen_model(self, slot: str, weights: StateDict) -> SplitModel:
        """The reused model `slot`, loaded with `weights`, without gradients, in eval mode."""
        model = self.parts.spare(slot).requires_grad_(False)
        load_partial(model, weights)
        return model.eval()

    def start(self, msg: Message, state: MoonState, ctx: ClientContext) -> MoonWork:
        """The received model; from the second round on, frozen copies of it (z_glob) and of the previous model."""
        model = self.client_model(msg, state)
        if state.prev is None:
            return MoonWork(msg=msg, ctx=ctx, model=model)
        return MoonWork(msg=msg, ctx=ctx, model=model, glob=self.frozen_model("global", state_of(model)),
                        prev=self.frozen_model("prev", state.prev))

    def loss(self, work: MoonWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE(logits, y) + mu * l_con (Eq. 4); CE only without a previous model or with mu = 0."""
        z, u = self.represent(work.model, x)
        ce = F.cross_entropy(work.model.head(u), y)
        if work.glob is None or work.prev is None or self.params.mu == 0:
            return ce
        with torch.no_grad():
            z_glob, z_prev = self.represent(work.glob, x)[0], self.represent(work.prev, x)[0]
        return ce + self.params.mu * contrastive_loss(z, z_glob, z_prev, self.params.temperature)

    def finish(self, work: MoonWork, state: MoonState, stats: FitStats) -> tuple[Message, MoonState]:
        """FedAvg's reply and local keys; the trained model becomes the next round's previous model."""
        reply, new_state = super().finish(work, state, stats)
        return reply, dataclasses.replace(new_state, prev=state_of(work.model))
