"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021, Algorithm 1): FedAvg for a global model w plus a personal model v_k on every client.

Each round a sampled client k receives w^t and
  - trains w exactly as FedAvg does (local SGD on cross-entropy from w^t) and sends it back;
  - trains its personal model v_k, kept in its ClientState and never sent, on the personal objective (eq. 2)
        h_k(v; w^t) = F_k(v) + (lam / 2) * ||v - w^t||^2,
    i.e. SGD steps v <- v - eta * (grad F_k(v) + lam * (v - w^t)), with w^t the frozen round-start global
    model (the "reference", not the w being trained in the same round).
The deployed model is v_k (personalized); the server aggregates the w's as FedAvg.

Choices where the paper is silent or that this implementation makes:
- `schedule="global_then_personal"`: the w pass (train config: local_epochs / local_steps), then the v pass
  for `personal_epochs` epochs (None: the same amount of local work as w). `schedule="tandem"`: per
  mini-batch one step of w, then one step of v on the same batch (so v takes as many steps as w;
  `personal_epochs` must then be None). The two schedules differ only in data order, since v's update
  depends on the frozen w^t, never on the current w.
- v starts, before the client's first round, as a copy of the global model it receives in that round.
- v uses the train config's optimizer and learning rate, with a fresh optimizer each round
  (`train.persist_optimizer` applies to w's optimizer only). The proximal term runs over v's trainable
  parameters; BatchNorm running statistics are part of v (personal) and are not penalised.
- The reference w^t is a frozen copy in eval mode (no gradients; BatchNorm uses running statistics).
- Clients that have never trained deploy the received global model.

Extension point: `personal_loss(work, x, y)` is the whole personal objective; a subclass (e.g. Ditto + MMD
feature constraints, which derives from `DittoFamily` with its own state and work types) overrides it, using
`self.proximal(work.personal, work.reference)` for the (lam/2)||v - w^t||^2 part and `work.reference` for the
features f_{w^t}(x). The reference and personal models are reused buffers (one each per algorithm instance),
so forward hooks registered once stay in place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
from torch import nn

from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.fedprox import proximal_term
from fedhet.algorithms.registry import register
from fedhet.config import TrainConfig
from fedhet.core.contract import (
    ClientContext,
    ClientState,
    Deployment,
    FitStats,
    LocalPass,
    LossStep,
    OptimSpec,
    ServerState,
    Work,
    loss_pass,
    minimize,
)
from fedhet.core.messages import Message
from fedhet.core.params import StateDict, state_of
from fedhet.errors import ConfigError
from fedhet.losses.classification import cross_entropy
from fedhet.models import SplitModel

SCHEDULES = ("global_then_personal", "tandem")


@dataclass(kw_only=True)
class DittoState(ClientState):
    """The client's personal model v (None before its first round)."""

    personal: StateDict | None = None


@dataclass(kw_only=True)
class DittoWork(Work):
    """The fit's w (`model`), the frozen round-start global model w^t and the personal model v."""

    reference: SplitModel
    personal: SplitModel


DS = TypeVar("DS", bound=DittoState)
DW = TypeVar("DW", bound=DittoWork)


@dataclass
class DittoParams:
    """lam: weight of (lam/2)||v - w||^2 (>= 0); personal_epochs: epochs of v per round (None: as w);
    schedule: global_then_personal | tandem."""

    lam: float = 0.1
    personal_epochs: int | None = None
    schedule: str = "global_then_personal"

    def validate(self) -> None:
        if not self.lam >= 0:
            raise ConfigError(f"ditto: lam must be >= 0, got {self.lam}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"ditto: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.personal_epochs is not None and self.personal_epochs < 1:
            raise ConfigError(f"ditto: personal_epochs must be >= 1 (or null), got {self.personal_epochs}")
        if self.personal_epochs is not None and self.schedule == "tandem":
            raise ConfigError("ditto: personal_epochs applies to schedule global_then_personal only; "
                              "with tandem, v takes one step per step of w")


DP = TypeVar("DP", bound=DittoParams)


class DittoFamily(Algorithm[ServerState, DS, DW, DP]):
    """FedAvg on w; a personal model v per client, pulled towards the round's global model."""

    personalized = True
    server_state_type = ServerState

    # ------------------------------------------------------------------ the personal objective
    def reference_model(self, model: nn.Module) -> SplitModel:
        """A frozen copy of `model` (the round-start global model w^t), in eval mode, without gradients."""
        reference = self.parts.spare("reference")
        reference.load_state_dict(model.state_dict())
        reference.eval().requires_grad_(False)
        return reference

    def personal_model(self, state: DittoState, fallback: nn.Module) -> SplitModel:
        """The client's personal model v, loaded from its state (before its first round: `fallback`'s weights)."""
        personal = self.parts.spare("personal")
        personal.load_state_dict(state.personal if state.personal is not None else fallback.state_dict())
        return personal

    def proximal(self, personal: nn.Module, reference: nn.Module) -> torch.Tensor:
        """(lam/2) * ||v - w^t||^2 over v's trainable parameters, paired with w^t's by name."""
        ref = dict(reference.named_parameters())
        pairs = [(p, ref[n]) for n, p in personal.named_parameters() if p.requires_grad]
        return 0.5 * self.params.lam * proximal_term([p for p, _ in pairs], [r for _, r in pairs])

    def personal_loss(self, work: DW, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Ditto's personal objective h_k(v; w^t) = CE(v(x), y) + (lam/2)||v - w^t||^2 (override to extend)."""
        return cross_entropy(work.personal, x, y) + self.proximal(work.personal, work.reference)

    # ------------------------------------------------------------------ client side
    def start(self, msg: Message, state: DS, ctx: ClientContext) -> DW:
        """w from the message, w^t its frozen copy, v from the state (w^t's weights before the first round)."""
        model = self.client_model(msg, state)
        reference = self.reference_model(model)
        return self.work_type(msg=msg, ctx=ctx, model=model, reference=reference,
                              personal=self.personal_model(state, reference))

    def personal_train_config(self) -> TrainConfig:
        """The local work of the v pass: `personal_epochs` epochs, or (None) the train config's."""
        epochs = self.params.personal_epochs
        return self.train_cfg if epochs is None else replace(self.train_cfg, local_epochs=epochs, local_steps=None)

    def passes(self, work: DW) -> list[LocalPass]:
        """global_then_personal: the w pass, then the v pass (fresh optimizer); tandem: per mini-batch one step
        of w, then one of v on the same batch."""
        personal_opt = {"personal": OptimSpec.from_train(list(work.personal.parameters()), self.personal_train_config(),
                                                         persist=False)}
        if self.params.schedule != "tandem":
            return [loss_pass(work.model, lambda x, y: self.loss(work, x, y), self.train_cfg),
                    LocalPass("personal", minimize(lambda x, y: self.personal_loss(work, x, y), "personal"),
                              personal_opt, self.personal_train_config(), modules=(work.personal,), report=False)]

        tandem = LossStep(((lambda x, y: self.loss(work, x, y), "model"),
                           (lambda x, y: self.personal_loss(work, x, y), "personal")))
        both = {"model": OptimSpec.from_train(list(work.model.parameters()), self.train_cfg), **personal_opt}
        return [LocalPass("local", tandem, both, self.train_cfg, modules=(work.model, work.personal))]

    def finish(self, work: DW, state: DS, stats: FitStats) -> tuple[Message, DS]:
        """Send w; keep w's local keys and v."""
        return self.parts.reply(work.model, stats), dataclasses.replace(
            state, local=state_of(work.model, self.parts.local_keys()), personal=state_of(work.personal))

    def deploy(self, msg: Message, state: DS, ctx: ClientContext) -> Deployment:
        """The personal model v (the received global model for a client that has not trained yet)."""
        if state.personal is None:
            return Deployment(self.client_model(msg, state))
        return Deployment(self.personal_model(state, self.parts.spare("personal")))


@register
class Ditto(DittoFamily[DittoState, DittoWork, DittoParams]):
    """Ditto with its own objective (Li et al. 2021, eq. 2)."""

    name = "ditto"
    Params = DittoParams
    # read in the personal pass's loss / config and in `passes` only
    capabilities = Capabilities(call_params=frozenset({"lam", "personal_epochs", "schedule"}))
    client_state_type = DittoState
    work_type = DittoWork
