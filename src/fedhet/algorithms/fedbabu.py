"""FedBABU (Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification",
ICLR 2022, Algorithm 1): federated training of the body only, then personalization by fine-tuning.

- During federated training the head keeps its random initialization and is never updated: it is excluded from
  the optimizer (so neither gradients, momentum nor weight decay touch it), it is not sent, and not averaged.
  Only the body (`model.features`) is trained locally and aggregated with FedAvg.
- Every client starts from the same head: the seeded initial model's head (`parts.new()` is built from the
  run's seed), which the server never has to send. It is kept as a local key, i.e. rebuilt from the initial
  model by `assemble`; since it never changes, what `finish` stores for it equals the initial head.
- The deployed model is the global body + the initial head, fine-tuned on the client's own training split for
  `finetune_epochs` epochs (the paper fine-tunes the whole model, `finetune_part="all"`; `"head"` fine-tunes
  only the head), with learning rate `finetune_lr` (default `train.lr`), as the deployment's pass
  (`Deployment.passes`). The fine-tune machinery, its BatchNorm and RNG choices and the guarantee that it
  changes neither the client state nor what is communicated are those of `PFedAvg` (fedhet.algorithms.pfedavg).
- If a head contained BatchNorm layers their running statistics would still move in train mode; the heads of
  the bundled models are plain linear layers.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from fedhet.algorithms.pfedavg import PFedAvg
from fedhet.algorithms.registry import register
from fedhet.core.contract import LocalPass, Work, loss_pass
from fedhet.core.params import keys_under


@register
class FedBABU(PFedAvg):
    """FedAvg on the body with the head frozen at its initialization; fine-tune at deployment."""

    name = "fedbabu"
    personalized = True

    def shared_keys(self, model: nn.Module) -> set[str]:
        """The body only: the head is never trained during FL, so there is nothing to send."""
        return set(model.state_dict()) - keys_under(model, "head")

    def passes(self, work: Work) -> list[LocalPass]:
        """FedAvg's local SGD on the body; the head's parameters are frozen for the whole pass."""
        head = tuple(work.model.head.parameters())
        body = loss_pass(work.model, lambda x, y: self.loss(work, x, y), self.train_cfg)
        return [dataclasses.replace(body, frozen=head)]
