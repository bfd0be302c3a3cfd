"""MOON (Li, He, Song, CVPR 2021): model-contrastive federated learning.

Implements the local objective of Eqs. 3-4 (Algorithm 1); the server is FedAvg:

    l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )   (Eq. 3)
    loss  = CE(logits, y) + mu * l_con                                                              (Eq. 4)

with sim the cosine similarity, z the representation of the model being trained, z_glob that of the frozen
global model received this round and z_prev that of the client's own model at the end of its previous round
(client state `state["prev"]`, every state key of the model).

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
from torch.utils.data import Dataset

from fedhet.algorithms.base import Algorithm, ClientContext, ClientState
from fedhet.algorithms.registry import register
from fedhet.engine.local import TrainStats
from fedhet.engine.messages import Message
from fedhet.engine.params import load_partial, state_of
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


@register
class Moon(Algorithm):
    """FedAvg whose local loss pulls z towards the global model's representation and away from the previous one."""

    name = "moon"

    @dataclass
    class Params:
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

    def __init__(self, params: Any, model_fn: Callable[[], SplitModel], *args: Any, **kwargs: Any) -> None:
        dim = params.projection_dim
        build = model_fn if dim is None else (lambda: ProjectedModel(model_fn(), dim))
        super().__init__(params, build, *args, **kwargs)

    def represent(self, model: SplitModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, features u): z = projection(u) when the model has a projection head, else u."""
        u = model.features(x)
        proj = getattr(model, "projection", None)
        return (proj(u) if proj is not None else u), u

    def _frozen_model(self, slot: str, weights: dict[str, torch.Tensor]) -> SplitModel:
        model = self.spare_model(slot).requires_grad_(False)
        load_partial(model, weights)
        return model.eval()

    def loss(self, model: SplitModel, x: torch.Tensor, y: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
        z, u = self.represent(model, x)
        ce = F.cross_entropy(model.head(u), y)
        glob, prev = ctx.extra.get("moon_global"), ctx.extra.get("moon_prev")
        if glob is None or prev is None or self.params.mu == 0:
            return ce
        with torch.no_grad():
            z_glob, z_prev = self.represent(glob, x)[0], self.represent(prev, x)[0]
        return ce + self.params.mu * contrastive_loss(z, z_glob, z_prev, self.params.temperature)

    def local_train(self, model: SplitModel, msg: Message, state: ClientState, ctx: ClientContext,
                    dataset: Dataset | None = None) -> TrainStats:
        """Hand the frozen global model (= the round-start model) and the previous local model to `loss`."""
        extra = dict(ctx.extra)
        if "prev" in state:
            extra["moon_global"] = self._frozen_model("global", state_of(model))
            extra["moon_prev"] = self._frozen_model("prev", state["prev"])
        return super().local_train(model, msg, state, dataclasses.replace(ctx, extra=extra), dataset)

    def fit(self, msg: Message, state: ClientState, ctx: ClientContext) -> tuple[Message, ClientState]:
        reply, state = super().fit(msg, state, ctx)
        state["prev"] = state_of(self.spare_model("workspace"))  # type: ignore[arg-type]  # the model fit just trained
        return reply, state
