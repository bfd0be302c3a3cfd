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

Local training (App. B.2): the config's optimizer (AdamW, lr 1e-4, weight decay 0.01, batch 64, 1 local epoch),
with a linear warm-up over the first `warmup` share of the steps and a linear decay to 0 (`schedule_scope`:
over one round's local steps, the default, or over the whole run: the paper's "total training steps" is
ambiguous). The PEFT modules are drawn from a seed derived from the initial backbone (so they follow the run seed).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedhet.algorithms.base import ModelAlgorithm
from fedhet.algorithms.registry import register
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.batches import num_steps, restrict_logits
from fedhet.core.contract import ClientContext, ClientState, FitStats, LocalPass, OptimSpec, Work, minimize
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


@dataclass
class PeftParams:
    """kind (table above); local_only: the "-L" baselines; reduction: adapter d/r (16); adapter_init: see
    models.peft.adapters; lora_projections "qk" (paper) | "qv" (official code), lora_rank; prompt_visual /
    prompt_text tokens; warmup share and schedule_scope of the LR schedule; betas of Adam(W) ((0.9, 0.98) in the
    official code); target: where adapters go (models.peft.insertion, "auto": after every FFN output);
    also_train: name patterns of new backbone parts each client trains and keeps, never sends (minilm_vl's image
    projection: ["patch_embeddings.*", "image_position"])."""

    kind: str = "adapter"
    local_only: bool = False
    reduction: int = 16
    adapter_init: str = "bert"
    lora_projections: str = "qk"
    lora_rank: int = 16
    prompt_visual: int = 10
    prompt_text: int = 10
    warmup: float = 0.1
    schedule_scope: str = "round"
    betas: tuple[float, float] = (0.9, 0.999)
    target: str = "auto"
    also_train: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.kind not in PEFT_KINDS:
            raise ConfigError(f"peft: kind must be one of {', '.join(PEFT_KINDS)}, got {self.kind!r}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"peft: warmup must be in [0, 1), got {self.warmup}")
        if self.schedule_scope not in SCOPES:
            raise ConfigError(f"peft: schedule_scope must be round or run, got {self.schedule_scope!r}")
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
            apply_lora(model, params.lora_projections, rank=params.lora_rank)
        elif params.kind == "prompt":
            add_prompts(model, params.prompt_visual, params.prompt_text)
    return model


@register
class PeftFedAvg(ModelAlgorithm):
    """FedAvg of a PEFT module over a frozen backbone, or local-only training (module docstring)."""

    name = "peft"
    Params = PeftParams
    personalized = True  # every client deploys its own head
    modality = "vision-language"
    counting_kind = ""  # models.peft.counting kind; "" = params.kind

    def __init__(self, params: PeftParams, model_fn: Callable[[], SplitModel], train: TrainConfig,
                 server: ServerConfig, num_classes: int, device: torch.device, num_clients: int = 0) -> None:
        self.selection: PeftParameters | None = None
        super().__init__(params, lambda: self.prepare(model_fn(), params), train, server, num_classes, device,
                         num_clients)

    def prepare(self, model: SplitModel, params: PeftParams) -> SplitModel:
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

    def finish(self, work: Work, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        local = state_of(work.model, self.kept_keys())
        return self.parts.reply(work.model, stats), dataclasses.replace(state, local=local)

    # ------------------------------------------------------------------ local training
    def trainable(self, model: nn.Module, names: set[str] | None = None) -> list[nn.Parameter]:
        chosen = set(self.peft.trainable) if names is None else names
        return [p for n, p in model.named_parameters() if n in chosen]

    def optimizer(self, params: list[nn.Parameter], ctx: ClientContext) -> OptimSpec:
        """The train config's optimizer with this method's betas and warm-up / linear-decay schedule."""
        spec = OptimSpec.from_train(params, self.train_cfg, persist=False)
        return dataclasses.replace(spec, betas=tuple(self.params.betas), lr_schedule=self.lr_factor(ctx))

    def lr_factor(self, ctx: ClientContext) -> Callable[[int], float]:
        steps = num_steps(ctx.data.num_train, self.train_cfg)
        if self.params.schedule_scope == "run":
            offset, total = (ctx.round - 1) * steps, ctx.rounds * steps
            return lambda t: warmup_linear_decay(offset + t, total, self.params.warmup)
        return lambda t: warmup_linear_decay(t, steps, self.params.warmup)

    def logits(self, model: nn.Module, x: Any, ctx: ClientContext) -> torch.Tensor:
        """The model's logits over the client's own answers (all of them without a pool)."""
        return restrict_logits(model(x), ctx.data.classes)

    def loss(self, work: Work, x: Any, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.logits(work.model, x, work.ctx), y)

    def passes(self, work: Work) -> list[LocalPass]:
        spec = self.optimizer(self.trainable(work.model), work.ctx)
        return [LocalPass("local", minimize(lambda x, y: self.loss(work, x, y)), {"model": spec}, self.train_cfg,
                          modules=(work.model,))]
