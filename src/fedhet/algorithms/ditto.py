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

Extension point: `personal_loss(personal, reference, x, y, ctx)` is the whole personal objective; a subclass
(e.g. Ditto + MMD feature constraints) overrides it, using `self.proximal(personal, reference)` for the
(lam/2)||v - w^t||^2 part and the reference model for the features f_{w^t}(x). The reference and personal
models are reused buffers (one each per algorithm instance), so forward hooks registered once stay in place.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
from torch import nn

from fedhet.algorithms.base import Algorithm, BatchedStep, ClientContext, ClientState, PersonalStep
from fedhet.algorithms.fedprox import proximal_term
from fedhet.algorithms.registry import register
from fedhet.config import TrainConfig
from fedhet.engine.local import TrainStats, batches, cross_entropy, make_optimizer, optimizer_step, train_local
from fedhet.engine.messages import Message
from fedhet.engine.params import state_of
from fedhet.errors import ConfigError
from fedhet.models import SplitModel

SCHEDULES = ("global_then_personal", "tandem")


@register
class Ditto(Algorithm):
    """FedAvg on w; a personal model v per client, pulled towards the round's global model."""

    name = "ditto"
    personalized = True

    @dataclass
    class Params:
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

    # ------------------------------------------------------------------ the personal objective
    def reference_model(self, model: nn.Module) -> SplitModel:
        """A frozen copy of `model` (the round-start global model w^t), in eval mode, without gradients."""
        reference = self.spare_model("reference")
        reference.load_state_dict(model.state_dict())
        reference.eval().requires_grad_(False)
        return reference

    def personal_model(self, state: ClientState, fallback: nn.Module) -> SplitModel:
        """The client's personal model v, loaded from its state (before its first round: `fallback`'s weights)."""
        personal = self.spare_model("personal")
        personal.load_state_dict(state["personal"] if "personal" in state else fallback.state_dict())
        return personal

    def proximal(self, personal: nn.Module, reference: nn.Module) -> torch.Tensor:
        """(lam/2) * ||v - w^t||^2 over v's trainable parameters, paired with w^t's by name."""
        ref = dict(reference.named_parameters())
        pairs = [(p, ref[n]) for n, p in personal.named_parameters() if p.requires_grad]
        return 0.5 * self.params.lam * proximal_term([p for p, _ in pairs], [r for _, r in pairs])

    def personal_loss(self, personal: SplitModel, reference: SplitModel, x: torch.Tensor, y: torch.Tensor,
                      ctx: ClientContext) -> torch.Tensor:
        """Ditto's personal objective h_k(v; w^t) = CE(v(x), y) + (lam/2)||v - w^t||^2 (override to extend)."""
        return cross_entropy(personal, x, y) + self.proximal(personal, reference)

    # ------------------------------------------------------------------ client side
    def fit(self, msg: Message, state: ClientState, ctx: ClientContext) -> tuple[Message, ClientState]:
        """Train w (sent back) and v (kept in the returned state) from the received w^t."""
        state = dict(state)
        model = self.client_model(msg, state)
        reference = self.reference_model(model)
        personal = self.personal_model(state, reference)
        if self.params.schedule == "tandem":
            stats = self.train_tandem(model, personal, reference, state, ctx)
        else:
            stats = self.local_train(model, msg, state, ctx)
            self.train_personal(personal, reference, ctx)
        state["local"] = state_of(model, self.local_keys())
        state["personal"] = state_of(personal)
        return self.reply(model, stats), state

    def personal_train_config(self) -> TrainConfig:
        """The local work of the v pass: `personal_epochs` epochs, or (None) the train config's."""
        epochs = self.params.personal_epochs
        return self.train_cfg if epochs is None else replace(self.train_cfg, local_epochs=epochs, local_steps=None)

    def batched_step(self) -> BatchedStep:
        """w: FedAvg's step; v: the personal objective with its own (fresh) optimizer. Only for this class:
        a subclass that extends `personal_loss` (Ditto + MMD) is not batched."""
        return BatchedStep(personal=PersonalStep(lam=self.params.lam, tandem=self.params.schedule == "tandem",
                                                 train=self.personal_train_config()))

    def train_personal(self, personal: SplitModel, reference: SplitModel, ctx: ClientContext) -> TrainStats:
        """The v pass of schedule global_then_personal."""
        cfg = self.personal_train_config()
        return train_local(personal, ctx.data.train, cfg, ctx.device,
                           loss_fn=lambda m, x, y: self.personal_loss(m, reference, x, y, ctx),  # type: ignore
                           where=f"{self.name} personal model, client {ctx.client_id} round {ctx.round}")

    def train_tandem(self, model: SplitModel, personal: SplitModel, reference: SplitModel, state: ClientState,
                     ctx: ClientContext) -> TrainStats:
        """Schedule tandem: for each mini-batch one SGD step of w (FedAvg loss), then one of v."""
        cfg = self.train_cfg
        opt_w, opt_v = make_optimizer(model.parameters(), cfg), make_optimizer(personal.parameters(), cfg)
        if cfg.persist_optimizer and "optim" in state:
            opt_w.load_state_dict(copy.deepcopy(state["optim"]))  # torch aliases the loaded buffers
        model.train()
        personal.train()
        where = f"{self.name} client {ctx.client_id} round {ctx.round}"
        total, steps, seen = 0.0, 0, 0
        for x, y in batches(ctx.data.train, cfg, device=ctx.device):
            total += optimizer_step(model, opt_w, self.loss(model, x, y, ctx), where, cfg.grad_clip)
            optimizer_step(personal, opt_v, self.personal_loss(personal, reference, x, y, ctx), where + " (personal)",
                           cfg.grad_clip)
            steps, seen = steps + 1, seen + len(y)
        if cfg.persist_optimizer:
            state["optim"] = copy.deepcopy(opt_w.state_dict())
        return TrainStats(loss=total / max(steps, 1), steps=steps, examples=seen)

    def deploy_model(self, msg: Message, state: ClientState, ctx: ClientContext) -> nn.Module:
        """The personal model v (the received global model for a client that has not trained yet)."""
        if "personal" not in state:
            return self.client_model(msg, state)
        return self.personal_model(state, self.spare_model("personal"))
