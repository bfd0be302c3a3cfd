"""Federated parameter-efficient fine-tuning of a frozen backbone: the PEFT baselines of FedDAT (Chen et al.,
AAAI 2024, App. A; spec feddat.md §4) in one method, `peft`, with `method_args.kind`:

| kind    | trained on a client (plus its head)    | communicated and averaged (Eq. 3)  | paper row       |
|---------|----------------------------------------|------------------------------------|-----------------|
| clf     | -                                      | nothing                            | clf-L           |
| adapter | A_s, Eq. 1 after every block's FFN     | A_s                                | Adapter         |
| lora    | LoRA on the attention projections      | the LoRA matrices                  | LoRA            |
| prompt  | 10 visual + 10 text input prompts      | the prompts                        | prompt          |
| bias    | the backbone's biases (BitFit)         | the biases                         | bias            |
| full    | the whole backbone                     | the backbone                       | full*           |

`local_only=true` communicates nothing (the "-L" rows: clf-L, Adapter-L, full-L*; each client trains alone for
the run's rounds). The classification head is client-specific and never leaves the client (ViLT / VAuLT:
"client-specific classification heads"); with a client answer pool (`ClientData.classes`, the Task benchmark)
its logits are restricted to that pool (a C^k-way head). The backbone stays frozen except where the kind trains
it; frozen weights are neither sent nor kept in the client state (every call loads the initial ones).

Local training (App. B.2): the config's optimizer (AdamW, weight decay 0.01, 1 local epoch) with the official
code's betas (0.9, 0.98) (task_trainer.py line 502) and LR schedule `lr_schedule` (docs/feddat.md):
"official" (default): a fresh warm-up + linear-decay schedule every round sized for `schedule_epochs` (15: main.py
line 307, `num_epochs`; train_vqa_crossvqa.py line 238) epochs of batches, 10 % warm-up, advanced at every
optimizer step (task_trainer.py lines 52-59, 304-307, 324-327: FedDAT steps twice a batch, so its lr climbs twice as
fast); "official_per_batch": the same advanced once a batch; "paper": warm-up over the first `warmup` share of
one round's steps (`schedule_scope` "round") or of the run's ("run"), then linear decay to 0. The PEFT modules are
drawn from a seed derived from the initial backbone (so they follow the run seed).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.registry import register
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.batches import num_steps, restrict_logits
from fedhet.core.contract import ClientContext, ClientState, FitStats, LocalPass, OptimSpec, ServerState, Work, minimize
from fedhet.core.messages import Message
from fedhet.core.params import state_of
from fedhet.errors import ConfigError
from fedhet.losses.distillation import warmup_linear_decay
from fedhet.models import SplitModel
from fedhet.models.peft.counting import PeftParameters, mark_trainable
from fedhet.models.peft.insertion import insert_adapters
from fedhet.models.peft.lora import apply_lora
from fedhet.models.peft.prompt import add_prompts

PEFT_KINDS = ("clf", "adapter", "lora", "prompt", "bias", "full")
SCOPES = ("round", "run")
SCHEDULES = ("official", "official_per_batch", "paper")
FORMS = {"lora_form": ("official", "peft"), "prompt_form": ("official", "paper")}


@dataclass
class PeftParams:
    """kind (table above); local_only: the "-L" baselines; reduction: adapter d/r (16); adapter_init: see
    models.peft.adapters; lora_form "official" (fresh q/v under LoRA, viltbert.py 369-374) | "peft";
    lora_projections "qv" (official code) | "qk" (paper), lora_rank; prompt_form "official" (Embedding -> MLP,
    main.py 214-229) | "paper" (free tokens), prompt_visual / prompt_text tokens (official 5 + 5, paper 10 + 10);
    lr_schedule official | official_per_batch | paper, schedule_epochs, warmup share and schedule_scope (paper);
    betas of Adam(W) (official (0.9, 0.98)); target: where adapters go (models.peft.insertion, "auto": after every
    FFN output); also_train: name patterns of new backbone parts each client trains and keeps, never sends
    (minilm_vl's image projection: ["patch_embeddings.*", "image_position"]). Defaults: the official code's."""

    kind: str = "adapter"
    local_only: bool = False
    reduction: int = 16
    adapter_init: str = "bert"
    lora_form: str = "official"
    lora_projections: str = "qv"
    lora_rank: int = 16
    prompt_form: str = "official"
    prompt_visual: int = 5
    prompt_text: int = 5
    lr_schedule: str = "official"
    schedule_epochs: int = 15
    warmup: float = 0.1
    schedule_scope: str = "round"
    betas: tuple[float, float] = (0.9, 0.98)
    target: str = "auto"
    also_train: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.kind not in PEFT_KINDS:
            raise ConfigError(f"peft: kind must be one of {', '.join(PEFT_KINDS)}, got {self.kind!r}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"peft: warmup must be in [0, 1), got {self.warmup}")
        choices = {"schedule_scope": SCOPES, "lr_schedule": SCHEDULES, **FORMS}
        for key, valid in choices.items():
            if getattr(self, key) not in valid:
                raise ConfigError(f"peft: {key} must be one of {', '.join(valid)}, got {getattr(self, key)!r}")
        if self.schedule_epochs < 1:
            raise ConfigError(f"peft: schedule_epochs must be >= 1, got {self.schedule_epochs}")
        if self.reduction < 1 or self.lora_rank < 1 or min(self.prompt_visual, self.prompt_text) < 0:
            raise ConfigError("peft: reduction and lora_rank must be >= 1, prompt token counts >= 0")


def seed_of(model: nn.Module) -> int:
    """A seed from the model's initial weights (which follow the run seed): modules added to it are drawn from
    it, whatever the global RNG's state (as MOON's projection head)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return int.from_bytes(digest.digest()[:7], "little")


def with_modules(model: SplitModel, params: PeftParams, dual: bool = False) -> SplitModel:
    """`model` with the modules of `params.kind` added (dual adapters for FedDAT), drawn from `seed_of(model)`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_of(model))
        if params.kind == "adapter" or dual:
            insert_adapters(model, params.target, params.reduction, dual=dual, init=params.adapter_init)
        elif params.kind == "lora":
            official = params.lora_form == "official"
            apply_lora(model, params.lora_projections, rank=params.lora_rank, alpha=1.0 if official else None,
                       fresh_base=official)
        elif params.kind == "prompt":
            add_prompts(model, params.prompt_visual, params.prompt_text, reparam=params.prompt_form == "official")
    return model


PW = TypeVar("PW", bound=Work)
PP = TypeVar("PP", bound=PeftParams)


class PeftFamily(Algorithm[ServerState, ClientState, PW, PP]):
    """FedAvg of a PEFT module over a frozen backbone, or local-only training (module docstring); FedDAT's base."""

    personalized = True  # every client deploys its own head
    capabilities = Capabilities(modality="vision-language")
    server_state_type = ServerState
    client_state_type = ClientState
    counting_kind = ""  # models.peft.counting kind; "" = params.kind

    def __init__(self, params: PP, model_fn: Callable[[], SplitModel], train: TrainConfig,
                 server: ServerConfig, num_classes: int, device: torch.device, num_clients: int = 0) -> None:
        self.selection: PeftParameters | None = None
        super().__init__(params, lambda: self.prepare(model_fn(), params), train, server, num_classes, device,
                         num_clients)

    def prepare(self, model: SplitModel, params: PP) -> SplitModel:
        """Add the kind's modules and mark exactly its trainable parameters."""
        model = with_modules(model, params, dual=self.counting_kind == "dat")
        self.selection = mark_trainable(model, self.counting_kind or params.kind, also_train=params.also_train)
        return model

    # ------------------------------------------------------------------ what moves where
    @property
    def peft(self) -> PeftParameters:
        assert self.selection is not None
        return self.selection

    def shared_keys(self, model: nn.Module) -> set[str]:
        return set() if self.params.local_only else set(self.peft.communicated)

    def kept_keys(self) -> set[str]:
        """What a client keeps between rounds: what it trains but does not send (its head, A_c, ...)."""
        return set(self.peft.trainable) - self.parts.shared

    def finish(self, work: PW, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        local = state_of(work.model, self.kept_keys())
        return self.parts.reply(work.model, stats), dataclasses.replace(state, local=local)

    # ------------------------------------------------------------------ local training
    def trainable(self, model: nn.Module, names: set[str] | None = None) -> list[nn.Parameter]:
        chosen = set(self.peft.trainable) if names is None else names
        return [p for n, p in model.named_parameters() if n in chosen]

    def optimizer(self, params: list[nn.Parameter], ctx: ClientContext) -> OptimSpec:
        """The train config's optimizer with this method's betas and warm-up / linear-decay schedule."""
        spec = OptimSpec.from_train(params, self.train_cfg, persist=False)
        beta1, beta2 = self.params.betas
        return dataclasses.replace(spec, betas=(beta1, beta2), lr_schedule=self.lr_factor(ctx))

    def steps_per_batch(self) -> int:
        """Optimizer steps one optimizer takes per batch (FedDAT's official update: 2)."""
        return 1

    def lr_factor(self, ctx: ClientContext) -> Callable[[int], float]:
        """The LR factor at an optimizer's step t of this round (`lr_schedule`, module doc)."""
        steps = num_steps(ctx.data.num_train, self.train_cfg)
        p = self.params
        if p.lr_schedule != "paper":  # one epoch's batches x schedule_epochs, fresh each round
            epoch = dataclasses.replace(self.train_cfg, local_epochs=1, local_steps=None)
            total = num_steps(ctx.data.num_train, epoch) * p.schedule_epochs
            per = 1 if p.lr_schedule == "official" else self.steps_per_batch()
            return lambda t: warmup_linear_decay(t // per, total, p.warmup)
        if self.params.schedule_scope == "run":
            offset, total = (ctx.round - 1) * steps, ctx.rounds * steps
            return lambda t: warmup_linear_decay(offset + t, total, self.params.warmup)
        return lambda t: warmup_linear_decay(t, steps, self.params.warmup)

    def logits(self, model: nn.Module, x: Any, ctx: ClientContext) -> torch.Tensor:  # Any: a VL batch as collated
        """The model's logits over the client's own answers (all of them without a pool)."""
        return restrict_logits(model(x), ctx.data.classes)

    def loss(self, work: PW, x: Any, y: torch.Tensor) -> torch.Tensor:  # Any: a VL batch as collated
        return nn.functional.cross_entropy(self.logits(work.model, x, work.ctx), y)

    def passes(self, work: PW) -> list[LocalPass]:
        spec = self.optimizer(self.trainable(work.model), work.ctx)
        return [LocalPass("local", minimize(lambda x, y: self.loss(work, x, y)), {"model": spec}, self.train_cfg,
                          modules=(work.model,))]


@register
class PeftFedAvg(PeftFamily[Work, PeftParams]):
    """The PEFT baselines: one `kind` of module trained and averaged (module docstring)."""

    name = "peft"
    Params = PeftParams
    work_type = Work
