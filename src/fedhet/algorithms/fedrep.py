"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized
Federated Learning", ICML 2021, Algorithm 1): a shared body (representation) and a personal head.

Per round, each sampled client
  1. loads the received global body and its own head (kept in its ClientState; never sent),
  2. trains the head for `head_epochs` epochs with the body frozen (Alg. 1, the tau head updates),
  3. trains the body with the head frozen, for the configured `train.local_epochs` / `train.local_steps`
     (Alg. 1, the representation update),
  4. sends the body; the server averages bodies as FedAvg does. The deployed model is global body + own head.

Choices where the paper is silent or that this implementation makes:
- "Frozen" means the parameters are excluded from the optimizer (requires_grad=False); the model stays in train
  mode in both phases, so BatchNorm running statistics in the body keep updating during the head phase too.
  Every BatchNorm buffer of the body is shared, like its parameters.
- The head phase always runs whole epochs (`train.local_steps` applies to the body phase only) with a fresh
  optimizer each round; `train.persist_optimizer` carries over only the body optimizer's state.
- A client's head starts, before its first round, from the seeded initial model's head (same for everyone).
- Both phases use the train config's optimizer and learning rate (the paper uses one step size for both).
- `head_epochs=0` skips the head phase (then the head never changes from its initialization).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn
from torch.utils.data import Dataset

from fedhet.algorithms.base import Algorithm, ClientContext, ClientState
from fedhet.algorithms.registry import register
from fedhet.config import TrainConfig
from fedhet.engine.local import TrainStats, train_local
from fedhet.engine.messages import Message
from fedhet.engine.params import frozen, keys_under
from fedhet.errors import ConfigError
from fedhet.models import SplitModel


@register
class FedRep(Algorithm):
    """Personal head trained first (body frozen), then the shared body (head frozen)."""

    name = "fedrep"
    personalized = True

    @dataclass
    class Params:
        """head_epochs: local epochs of head training per round, before the body is trained (>= 0)."""

        head_epochs: int = 5

        def validate(self) -> None:
            if self.head_epochs < 0:
                raise ConfigError(f"fedrep: head_epochs must be >= 0, got {self.head_epochs}")

    def shared_keys(self, model: nn.Module) -> set[str]:
        """The body (features) is shared; every key under `head` is personal."""
        return set(model.state_dict()) - keys_under(model, "head")

    def train_head(self, model: SplitModel, ctx: ClientContext, dataset: Dataset,
                   train_cfg: TrainConfig | None = None) -> TrainStats | None:
        """Phase 1: `head_epochs` epochs on the head, the body's parameters frozen."""
        if self.params.head_epochs == 0:
            return None
        cfg = replace(train_cfg or self.train_cfg, local_epochs=self.params.head_epochs, local_steps=None)
        with frozen(model.features.parameters()):
            return train_local(model, dataset, cfg, ctx.device, loss_fn=lambda m, x, y: self.loss(m, x, y, ctx),
                               where=f"{self.name} head, client {ctx.client_id} round {ctx.round}")

    def local_train(self, model: SplitModel, msg: Message, state: ClientState, ctx: ClientContext,
                    dataset: Dataset | None = None, train_cfg: TrainConfig | None = None) -> TrainStats:
        """Head phase, then body phase (FedAvg's local SGD with the head frozen); reports the body phase."""
        data = ctx.data.train if dataset is None else dataset
        self.train_head(model, ctx, data, train_cfg)
        with frozen(model.head.parameters()):
            return super().local_train(model, msg, state, ctx, data, train_cfg)
