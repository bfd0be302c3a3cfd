"""FedDAT: Federated Dual-Adapter Teacher (Chen, Zhang, Krompass, Gu, Tresp, AAAI 2024; thesis ch. 3; spec
feddat.md), Alg. 1 on a frozen backbone:

- every Transformer block gets A_s (shared, Eq. 1), Â_s (a frozen copy of the received A_s, re-copied every
  round) and A_c (the client's own adapter, initialised once, kept on the client, never sent);
- each local step t, on one batch: z_s with path A_s, z_DAT with path DAT (Eq. 4: h + 1/2 Â_s(h) + 1/2 A_c(h)),
  L^s = CE(z_s) + alpha KL(z_s || z_DAT) trains A_s (and the client's head), L^DAT = CE(z_DAT) +
  beta KL(z_DAT || z_s) trains A_c (Eqs. 5-7), alpha = beta = exp(-5 (1 - t / T_0)) (App. B.2);
- the server averages A_s only (uniform as in Alg. 1 line 6: `server.aggregation: uniform`; N_k-weighted as
  in Eq. 3: `weighted`); the deployed model is the backbone with A_s (`inference`).

Where the paper and the official code (HaokunChen245/FedDAT, "official", src/train/visionlanguage_tasks/
task_trainer.py, "tt") differ, a switch; the default is the official code's, because it reproduces the authors'
numbers (docs/feddat.md lists every difference):
- `update`: "sequential" (tt 280-330: z_DAT without gradient, A_s steps on L^s, then the DAT path is recomputed and
  A_c steps on L^DAT with the pre-step z_s as its target, one optimizer and scheduler stepping twice a batch) |
  "simultaneous" (Alg. 1 read as one step: both losses from one forward, each optimizer on its own loss);
- `kl_direction`: "official" (tt 300, 320, 506-516: KL(p_DAT || p_s) for A_s, KL(p_s || p_DAT) for A_c) |
  "printed" (Eq. 5: KL(z_s || z_DAT) for A_s);
- `head_losses`: "both" (tt 248-250 of main.py: the head is always trainable, so it steps on L^s and L^DAT) |
  "shared" (the deployed path's head trains on L^s only);
- `ramp`: "constant" (alpha = beta = 1, official) | "exp" (App. B.2), `ramp_scope` "round" | "run";
- `temperature` 3 and `scale_t2` true (tt 506-516; the paper: 1, unscaled); `betas`, `lr_schedule`: PeftParams;
- `dat_weights` (1/2, 1/2) of Eq. 4 (fixed in paper and code: models/adapter.py 144).
- Table 4 ablation: `frozen_teacher=false` (DAT without Â_s: A_c alone), `client_adapter=false` (without A_c:
  the teacher is Â_s alone and nothing trains on L^DAT), `reverse_kl=false` (L^DAT = CE only), `inference`
  "shared" | "dat" | "client".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedhet.algorithms.base import Capabilities
from fedhet.algorithms.peft_fl import PeftFamily, PeftParams, seed_of
from fedhet.algorithms.registry import register
from fedhet.core.batches import num_steps, restrict_logits
from fedhet.core.contract import ClientContext, ClientState, Deployment, LocalPass, Optimizers, Work
from fedhet.core.messages import Message
from fedhet.errors import ConfigError
from fedhet.losses.distillation import KL_DIRECTIONS, exp_rampup, kl_term
from fedhet.models import SplitModel
from fedhet.models.peft.adapters import CLIENT, SHARED, BottleneckAdapter
from fedhet.models.peft.insertion import (
    adapter_modules,
    adapter_named_parameters,
    adapter_path,
    adapter_state,
    refresh_frozen_copy,
    set_adapter_path,
)

INFERENCE = ("shared", "dat", "client")


@dataclass
class FedDATParams(PeftParams):
    """PeftParams (warm-up, scope, betas, reduction, adapter init, target) plus FedDAT's switches (module doc)."""

    kind: str = "adapter"
    update: str = "sequential"
    kl_direction: str = "official"
    head_losses: str = "both"
    ramp: str = "constant"
    ramp_scope: str = "round"
    temperature: float = 3.0
    scale_t2: bool = True
    dat_weights: tuple[float, float] = (0.5, 0.5)
    frozen_teacher: bool = True
    client_adapter: bool = True
    reverse_kl: bool = True
    inference: str = "shared"

    def validate(self) -> None:
        super().validate()
        choices = {"update": ("simultaneous", "sequential"), "ramp": ("exp", "constant"),
                   "ramp_scope": ("round", "run"), "inference": INFERENCE, "kl_direction": KL_DIRECTIONS,
                   "head_losses": ("both", "shared")}
        for key, valid in choices.items():
            if getattr(self, key) not in valid:
                raise ConfigError(f"feddat: {key} must be one of {', '.join(valid)}, got {getattr(self, key)!r}")
        if self.kind != "adapter" or self.local_only:
            raise ConfigError("feddat: kind is always adapter and local_only false (use method=peft for baselines)")
        if self.temperature <= 0:
            raise ConfigError(f"feddat: temperature must be > 0, got {self.temperature}")
        if not self.client_adapter and self.inference != "shared":
            raise ConfigError("feddat: inference with the DAT or A_c needs client_adapter=true")


@dataclass
class DATWork(Work):
    """The fit's model with its three adapter slots, the step counter t and T_0 of the ramp-up."""

    step: int = 0
    steps: int = 1
    offset: int = 0


@register
class FedDAT(PeftFamily[DATWork, FedDATParams]):
    """Alg. 1 of FedDAT (module docstring)."""

    name = "feddat"
    Params = FedDATParams
    # the KD terms and their weight's ramp-up: read in `start` and the losses only
    capabilities = Capabilities(call_params=frozenset({"temperature", "scale_t2", "kl_direction", "reverse_kl", "ramp",
                                                       "ramp_scope"}), modality="vision-language")
    counting_kind = "dat"
    work_type = DATWork

    def prepare(self, model: SplitModel, params: FedDATParams) -> SplitModel:
        model = super().prepare(model, params)
        weights = params.dat_weights
        for _, adapter in adapter_modules(model):
            adapter.dat_weights = (float(weights[0]), float(weights[1]))
        if not params.client_adapter:  # w/o A_c: it never trains
            for _, p in adapter_named_parameters(model, CLIENT):
                p.requires_grad_(False)
        return model

    def kept_keys(self) -> set[str]:
        keys = super().kept_keys()  # head + A_c
        return keys if self.params.client_adapter else {k for k in keys if f".slots.{CLIENT}." not in k}

    # ------------------------------------------------------------------ client side
    def init_client(self, client_id: int) -> ClientState:
        """A_c "randomly initialised at r = 1" (Alg. 1): each client's from the initial model plus its id."""
        state = super().init_client(client_id)
        model = self.parts.new()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((seed_of(self.parts.template) + 1 + client_id) % 2**63)
            for _, adapter in adapter_modules(model):
                client = adapter.slots[CLIENT]
                assert isinstance(client, BottleneckAdapter)  # a ModuleDict gives a Module
                client.reset_parameters(self.params.adapter_init)
        return dataclasses.replace(state, local=adapter_state(model, CLIENT))

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> DATWork:
        """Â_s <- received A_s (Alg. 1), the ramp-up's T_0."""
        model = self.client_model(msg, state)
        refresh_frozen_copy(model)
        set_adapter_path(model, "shared")
        steps = num_steps(ctx.data.num_train, self.train_cfg)
        offset = (ctx.round - 1) * steps if self.params.ramp_scope == "run" else 0
        total = ctx.rounds * steps if self.params.ramp_scope == "run" else steps
        return DATWork(msg=msg, ctx=ctx, model=model, steps=total, offset=offset)

    def teacher_path(self) -> str:
        if not self.params.frozen_teacher:
            return "client"
        return "dat" if self.params.client_adapter else "frozen_shared"

    def weight(self, work: DATWork) -> float:
        """alpha = beta at this step (App. B.2 ramp-up, or 1)."""
        if self.params.ramp == "constant":
            return 1.0
        return exp_rampup(work.offset + work.step, work.steps)

    # Any: a VL batch as collated
    def path_logits(self, work: DATWork, x: Any, path: str, head_grad: bool = True) -> torch.Tensor:  # Any: a batch's x
        """Logits through adapter `path`; `head_grad=False`: the head's weights detached (no gradient into it)."""
        with adapter_path(work.model, path):
            if head_grad:
                return self.logits(work.model, x, work.ctx)
            head = work.model.head
            weights = {k: v.detach() for k, v in head.named_parameters()}
            return restrict_logits(functional_call(head, weights, (work.model.features(x),)), work.ctx.data.classes)

    def losses(self, z_s: torch.Tensor, z_dat: torch.Tensor, y: torch.Tensor, w: float) -> tuple[torch.Tensor, ...]:
        """(L^s, L^DAT) of Eqs. 5-7, each KL towards the other's logits as a fixed target (`kl_direction`)."""
        p, ce = self.params, nn.functional.cross_entropy
        loss_s = ce(z_s, y) + w * kl_term(z_s, z_dat, p.kl_direction, p.temperature, p.scale_t2)
        kl_dat = kl_term(z_dat, z_s, p.kl_direction, p.temperature, p.scale_t2) if p.reverse_kl else 0.0
        return loss_s, ce(z_dat, y) + w * kl_dat

    def single_optimizer(self) -> bool:
        """The official update: one optimizer over A_s, A_c and the head, stepped on L^s and then on L^DAT."""
        p = self.params
        return bool(p.update == "sequential" and p.head_losses == "both" and p.client_adapter)

    def steps_per_batch(self) -> int:
        return 2 if self.single_optimizer() else 1

    # Any: a VL batch as collated
    def dat_step(self, work: DATWork, x: Any, y: torch.Tensor, optimizers: Optimizers) -> torch.Tensor:  # Any: as above
        """One local step of Alg. 1: L^s for A_s (+ head), L^DAT for A_c (+ head: `head_losses`), `update`."""
        p, w = self.params, self.weight(work)
        work.step += 1
        name_s, name_c = ("model", "model") if self.single_optimizer() else (SHARED, CLIENT)
        if p.update == "simultaneous":
            z_s, z_dat = self.path_logits(work, x, "shared"), self.path_logits(work, x, self.teacher_path())
            loss_s, loss_dat = self.losses(z_s, z_dat, y, w)
            optimizers.step_each({SHARED: loss_s, CLIENT: loss_dat} if p.client_adapter else {SHARED: loss_s})
            return loss_s
        with torch.no_grad():  # tt 283-287: the teacher's logits first, without gradient
            z_dat = self.path_logits(work, x, self.teacher_path())
        z_s = self.path_logits(work, x, "shared")
        loss_s, _ = self.losses(z_s, z_dat, y, w)
        optimizers.step(loss_s, name_s)
        if p.client_adapter:  # tt 311-328: the DAT path again, its target the pre-step z_s
            z_dat = self.path_logits(work, x, self.teacher_path(), head_grad=p.head_losses == "both")
            optimizers.step(self.losses(z_s.detach(), z_dat, y, w)[1], name_c)
        return loss_s

    def passes(self, work: DATWork) -> list[LocalPass]:
        client = {n for n, _ in adapter_named_parameters(work.model, CLIENT)}
        shared = set(self.peft.trainable) - client
        own = shared - {n for n, _ in adapter_named_parameters(work.model, SHARED)}  # head, also_train
        if self.single_optimizer():
            specs = {"model": self.optimizer(self.trainable(work.model), work.ctx)}
        else:
            specs = {SHARED: self.optimizer(self.trainable(work.model, shared), work.ctx)}
            if self.params.client_adapter:
                both = client | own if self.params.head_losses == "both" else client
                specs[CLIENT] = self.optimizer(self.trainable(work.model, both), work.ctx)
        return [LocalPass("local", lambda x, y, o: self.dat_step(work, x, y, o), specs, self.train_cfg,
                          modules=(work.model,))]

    def deploy(self, msg: Message, state: ClientState, ctx: ClientContext) -> Deployment:
        """The backbone with A_s (the paper), or with the DAT / A_c (Table 4's inference rows)."""
        model = self.client_model(msg, state)
        refresh_frozen_copy(model)
        set_adapter_path(model, self.params.inference)
        return Deployment(model)
