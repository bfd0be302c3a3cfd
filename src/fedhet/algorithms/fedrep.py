"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized
Federated Learning", ICML 2021, Algorithm 1): a shared body (representation) and a personal head.

Per round, each sampled client
  1. loads the received global body and its own head (kept in its ClientState; never sent),
  2. trains the head for `head_epochs` epochs with the body frozen (Alg. 1, the tau head updates),
  3. trains the body with the head frozen, for the configured `train.local_epochs` / `train.local_steps`
     (Alg. 1, the representation update),
  4. sends the body; the server averages bodies as FedAvg does. The deployed model is global body + own head.

Choices where the paper is silent or that this implementation makes:
- "Frozen" means the parameters are excluded from the optimizer (requires_grad=False, the pass's
  `LocalPass.frozen`); the model stays in train mode in both phases, so BatchNorm running statistics in the
  body keep updating during the head phase too. Every BatchNorm buffer of the body is shared, like its
  parameters.
- The head phase always runs whole epochs (`train.local_steps` applies to the body phase only) with a fresh
  optimizer each round; `train.persist_optimizer` carries over only the body optimizer's state.
- A client's head starts, before its first round, from the seeded initial model's head (same for everyone).
- Both phases use the train config's optimizer and learning rate (the paper uses one step size for both).
- `head_epochs=0` skips the head phase (then the head never changes from its initialization).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from torch import nn

from fedhet.algorithms.base import Capabilities, ModelAlgorithm
from fedhet.algorithms.registry import register
from fedhet.core.contract import LocalPass, OptimSpec, Work, loss_pass, minimize
from fedhet.core.params import keys_under
from fedhet.errors import ConfigError


@dataclass
class FedRepParams:
    """head_epochs: local epochs of head training per round, before the body is trained (>= 0)."""

    head_epochs: int = 5

    def validate(self) -> None:
        if self.head_epochs < 0:
            raise ConfigError(f"fedrep: head_epochs must be >= 0, got {self.head_epochs}")


@register
class FedRep(ModelAlgorithm[FedRepParams]):
    """Personal head trained first (body frozen), then the shared body (head frozen)."""

    name = "fedrep"
    personalized = True
    Params = FedRepParams
    capabilities = Capabilities(call_params=frozenset({"head_epochs"}))  # read in `passes` only

    def shared_keys(self, model: nn.Module) -> set[str]:
        """The body (features) is shared; every key under `head` is personal."""
        return set(model.state_dict()) - keys_under(model, "head")

    def head_pass(self, work: Work) -> LocalPass:
        """Phase 1: `head_epochs` epochs on the head, the body's parameters frozen, a fresh optimizer."""
        model = work.model
        cfg = replace(self.train_cfg, local_epochs=self.params.head_epochs, local_steps=None)
        spec = OptimSpec.from_train(list(model.parameters()), cfg, persist=False)
        return LocalPass("head", minimize(lambda x, y: self.loss(work, x, y), "head"), {"head": spec}, cfg,
                         modules=(model,), frozen=tuple(model.features.parameters()), report=False)

    def passes(self, work: Work) -> list[LocalPass]:
        """Head pass (skipped when `head_epochs=0`), then the body pass (FedAvg's local SGD with the head
        frozen), which is the one reported."""
        body = dataclasses.replace(loss_pass(work.model, lambda x, y: self.loss(work, x, y), self.train_cfg),
                                   frozen=tuple(work.model.head.parameters()))
        return ([self.head_pass(work)] if self.params.head_epochs > 0 else []) + [body]
