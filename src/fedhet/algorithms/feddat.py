"""FedDAT: Federated Dual-Adapter Teacher (Chen, Zhang, Krompass, Gu, Tresp, AAAI 2024; thesis ch. 3; spec
feddat.md), Alg. 1 on a frozen backbone:

- every Transformer block gets A_s (shared, Eq. 1), Â_s (a frozen copy of the received A_s, re-copied every
  round) and A_c (the client's own adapter, initialised once, kept on the client, never sent);
- each local step t, on one batch: z_s with path A_s, z_DAT with path DAT (Eq. 4: h + 1/2 Â_s(h) + 1/2 A_c(h)),
  L^s = CE(z_s) + alpha KL(z_s || z_DAT) trains A_s (and the client's head), L^DAT = CE(z_DAT) +
  beta KL(z_DAT || z_s) trains A_c (Eqs. 5-7), alpha = beta = exp(-5 (1 - t / T_0)) (App. B.2);
- the server averages A_s only (uniform as in Alg. 1 line 6: `server.aggregation: uniform`; N_k-weighted as
  in Eq. 3: `weighted`); the deployed model is the backbone with A_s (`inference`).

Where the paper is silent or the official code differs, a switch (default: the paper as printed):
- `update`: "simultaneous" (both losses from one forward, both adapters step on them: the paper's Alg. 1
  read as one step) | "sequential" (the official code: A_s steps, then both paths are recomputed and A_c steps);
- `ramp`: "exp" (App. B.2) | "constant" (alpha = beta = 1, the official code); `ramp_scope` "round" (T_0 =
  one round's local steps; "based on the local update steps t") | "run";
- `temperature` (1) and `scale_t2` (False): the official code uses T = 3 and scales the KL by T^2;
- `dat_weights` (1/2, 1/2) of Eq. 4 (fixed in paper and code); `betas` of AdamW (official (0.9, 0.98));
- the client's head trains with A_s (on L^s): the deployed path's head; L^DAT updates A_c only.
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

from fedhet.algorithms.peft_fl import PeftFedAvg, PeftParams, seed_of
from fedhet.algorithms.registry import register
from fedhet.core.batches import num_steps
from fedhet.core.contract import ClientContext, ClientState, Deployment, LocalPass, Optimizers, Work
from fedhet.core.messages import Message
from fedhet.errors import ConfigError
from fedhet.losses.distillation import exp_rampup, kl_to_target
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
    update: str = "simultaneous"
    ramp: str = "exp"
    ramp_scope: str = "round"
    temperature: float = 1.0
    scale_t2: bool = False
    dat_weights: tuple[float, float] = (0.5, 0.5)
    frozen_teacher: bool = True
    client_adapter: bool = True
    reverse_kl: bool = True
    inference: str = "shared"

    def validate(self) -> None:
        super().validate()
        choices = {"update": ("simultaneous", "sequential"), "ramp": ("exp", "constant"),
                   "ramp_scope": ("round", "run"), "inference": INFERENCE}
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
class FedDAT(PeftFedAvg):
    """Alg. 1 of FedDAT (module docstring)."""

    name = "feddat"
    Params = FedDATParams
    counting_kind = "dat"
    work_type = DATWork

    def prepare(self, model: Any, params: PeftParams) -> Any:
        model = super().prepare(model, params)
        weights = getattr(params, "dat_weights", (0.5, 0.5))
        for _, adapter in adapter_modules(model):
            adapter.dat_weights = (float(weights[0]), float(weights[1]))
        if not getattr(params, "client_adapter", True):  # w/o A_c: it never trains
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
                client: BottleneckAdapter = adapter.slots[CLIENT]  # type: ignore[assignment]
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

    def both_logits(self, work: DATWork, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with adapter_path(work.model, "shared"):
            z_s = self.logits(work.model, x, work.ctx)
        with adapter_path(work.model, self.teacher_path()):
            z_dat = self.logits(work.model, x, work.ctx)
        return z_s, z_dat

    def dat_step(self, work: DATWork, x: Any, y: torch.Tensor, optimizers: Optimizers) -> torch.Tensor:
        """One local step of Alg. 1: L^s for A_s (+ head), L^DAT for A_c."""
        p, w = self.params, self.weight(work)
        work.step += 1
        ce, kl = nn.functional.cross_entropy, kl_to_target
        z_s, z_dat = self.both_logits(work, x)
        loss_s = ce(z_s, y) + w * kl(z_s, z_dat, p.temperature, p.scale_t2)
        if not p.client_adapter:
            optimizers.step(loss_s, SHARED)
            return loss_s
        if p.update == "sequential":
            optimizers.step(loss_s, SHARED)
            z_s, z_dat = self.both_logits(work, x)
        loss_dat = ce(z_dat, y) + (w * kl(z_dat, z_s, p.temperature, p.scale_t2) if p.reverse_kl else 0.0)
        if p.update == "sequential":
            optimizers.step(loss_dat, CLIENT)
        else:
            optimizers.step_each({SHARED: loss_s, CLIENT: loss_dat})
        return loss_s

    def passes(self, work: DATWork) -> list[LocalPass]:  # type: ignore[override]
        shared = self.trainable(work.model, set(self.peft.trainable) - {n for n, _ in adapter_named_parameters(
            work.model, CLIENT)})
        specs = {SHARED: self.optimizer(shared, work.ctx)}
        if self.params.client_adapter:
            specs[CLIENT] = self.optimizer([p for _, p in adapter_named_parameters(work.model, CLIENT)], work.ctx)
        return [LocalPass("local", lambda x, y, o: self.dat_step(work, x, y, o), specs, self.train_cfg,
                          modules=(work.model,))]

    def deploy(self, msg: Message, state: ClientState, ctx: ClientContext) -> Deployment:
        """The backbone with A_s (the paper), or with the DAT / A_c (Table 4's inference rows)."""
        model = self.client_model(msg, state)
        refresh_frozen_copy(model)
        set_adapter_path(model, self.params.inference)
        return Deployment(model)
