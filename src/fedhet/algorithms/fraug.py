"""FRAug (Chen, Frikha, Krompass, Gu, Tresp, ICCV 2023): federated representation augmentation.

Each client k holds a classifier f^k/h^k (shared; its BatchNorm local or affine-shared per `bn_share`), a copy of the
shared class-conditional generator g (sent and averaged under the `gen/` key prefix), a local RTNet m^k and
EMA class prototypes u_bar_c^k (both kept in the ClientState, never sent). Per local step (Alg. 1):

  stage 1 (g, m fixed): update f, h on  L_real + L_syn                                        (Eq. 1)
      L_real = CE(h(u), y),  u = f(x)
      L_syn  = CE(h(u_hat), y) + sum_c CE(h(u_hat_c), c)      (reaches the head only)         (Eq. 2)
      u_hat  = u + lam_syn * m(g(z, y)),  u_hat_c = u_bar_c + lam_syn * m(g(z', c))            (Eq. 3)
      u_bar_c <- (1 - lam_c) u_bar_c + lam_c * mean_{i: y_i = c} f(x_i)                         (Eq. 4)
  stage 2 (classifier fixed):
      L_gen = CE(h(v_hat), y) - alpha * MMD(v_hat, u),  v_hat = g(z, y)          -> g only    (Eq. 5)
      L_rt  = -Ent(h(u_hat)) - sum_c Ent(h(u_hat_c))
              + beta * (MMD(u_hat, u) + sum_c MMD(u_hat_c, u_bar_c))               -> m only    (Eq. 6)

The losses and schedules: `fedhet.algorithms.fraug_losses`. Every choice the paper leaves open, and every way the
official code (HaokunChen245/FRAug) differs from it, is a `Params` field (`fraug_params`), all set by `preset`
(`official`, the default, or `paper`); docs/fraug.md tabulates them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.algorithms import fraug_losses as fl
from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.fraug_losses import Draws, initial_prototypes, lambda_c, lambda_syn, update_prototypes
from fedhet.algorithms.fraug_params import FRAugParams
from fedhet.algorithms.registry import register
from fedhet.core.contract import (
    ClientContext,
    ClientState,
    FitStats,
    LocalPass,
    Optimizers,
    OptimSpec,
    ServerState,
    Work,
)
from fedhet.core.messages import Message
from fedhet.core.params import BN_TYPES, StateDict, keys_of_types, state_of
from fedhet.errors import ConfigError
from fedhet.models import SplitModel
from fedhet.models.fraug_nets import Generator, RTNet

__all__ = ["DIAGNOSTICS", "GEN", "Draws", "FRAug", "FRAugParams", "FRAugState", "FRAugWork", "lambda_c", "lambda_syn",
           "update_prototypes"]

GEN = "gen/"
DIAGNOSTICS = ("gen_loss", "rt_loss", "mmd_rt", "res_norm", "u_norm", "sigma")


@dataclass(kw_only=True)
class FRAugState(ClientState):
    """The client's RTNet m^k, its EMA prototypes u_bar^k (C x d_u) with their seen flags, and where the
    prototype labels' rotation stands (None / 0 before the client first trains; protos under `proto_persist`)."""

    rtnet: StateDict | None = None
    protos: Tensor | None = None
    proto_seen: Tensor | None = None
    proto_cursor: int = 0


@dataclass(kw_only=True)
class FRAugWork(Work):
    """The fit's classifier (`model`), generator g and RTNet m (None when ablated), prototypes and their label
    cursor, the round's schedules lam_c / lam_syn, and the float32 sums of the reported loss and DIAGNOSTICS."""

    model: SplitModel
    gen: nn.Module | None
    rt: nn.Module | None
    protos: Tensor
    seen: Tensor
    cursor: int
    lam_c: float
    lam_syn: float
    mix: float | None = None
    totals: Tensor = field(default_factory=lambda: torch.zeros(1 + len(DIAGNOSTICS)))
    aug_steps: int = 0


@register
class FRAug(Algorithm[ServerState, FRAugState, FRAugWork, FRAugParams]):
    """Shared generator + local RTNet + EMA prototypes augment the head's training in the embedding space."""

    name = "fraug"
    personalized = True
    Params = FRAugParams
    # L_G / L_FT weights, g / m step sizes: read per step
    capabilities = Capabilities(call_params=frozenset({"alpha", "beta", "eta_g", "eta_m"}))
    server_state_type, client_state_type, work_type = ServerState, FRAugState, FRAugWork

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: forwarded to Algorithm.__init__
        super().__init__(*args, **kwargs)
        self._nets: dict[str, nn.Module] = {}  # reused g / m buffers, fully loaded (or re-initialised) per fit
        if self.params.aggregation != "server":  # official: weighted by N_k (server_base.py:53-66)
            if self.server_cfg.aggregation not in ("weighted", "uniform"):
                raise ConfigError(f"fraug's method_args.aggregation={self.params.aggregation} replaces server."
                                  f"aggregation={self.server_cfg.aggregation}: set method_args.aggregation=server")
            self.server_cfg = dataclasses.replace(self.server_cfg, aggregation=self.params.aggregation)

    def shared_keys(self, model: nn.Module) -> set[str]:
        """All but the classifier's BatchNorm (`bn_share: none`, FedBN) or all but its running statistics (`affine`:
        the official model_share 'no_bn_running_stats', server_base.py:78)."""
        local = keys_of_types(model, BN_TYPES)
        if self.params.bn_share == "affine":
            local -= dict(model.named_parameters()).keys()
        return set(model.state_dict()) - local

    # ------------------------------------------------------------------ networks
    def new_generator(self) -> Generator:
        return Generator(self.params.z_dim, self.num_classes, self.parts.template.feature_dim).to(self.device)

    def new_rtnet(self) -> RTNet:
        classes = self.num_classes if self.params.rt_label_input else 0
        return RTNet(self.parts.template.feature_dim, self.params.z_dim, classes).to(self.device)

    def _net(self, slot: str, weights: StateDict | None) -> nn.Module:
        """The reused network of `slot` ("gen" | "rt"), loaded with `weights`, or (None) freshly initialised from
        the fit's RNG. A slot built only to be loaded does not draw from the fit's RNG (its init is overwritten),
        so a fit's random stream does not depend on whether this process has built the slot before (Flower runs
        each client in its own process)."""
        build = self.new_generator if slot == "gen" else self.new_rtnet
        if weights is None:
            self._nets[slot] = build()
            return self._nets[slot].train()
        if slot not in self._nets:
            with torch.random.fork_rng(devices=[]):
                self._nets[slot] = build()
        self._nets[slot].load_state_dict(weights)
        return self._nets[slot].train()

    def init_server(self) -> ServerState:
        server = super().init_server()
        if not self.params.use_generator:
            return server
        gen = {GEN + k: v for k, v in state_of(self.new_generator()).items()}
        return dataclasses.replace(server, model={**server.model, **gen})

    # ------------------------------------------------------------------ client side
    def start(self, msg: Message, state: FRAugState, ctx: ClientContext) -> FRAugWork:
        """The classifier (received shared part + local BN), g from the message, m from the state (fresh at the
        client's first round), the prototypes, and the round's schedules."""
        p = self.params
        model = self.client_model(msg, state)
        gen = self._net("gen", {k[len(GEN):]: v for k, v in msg.arrays.items() if k.startswith(GEN)}
                        ) if p.use_generator else None
        rt = self._net("rt", state.rtnet) if p.use_rtnet else None
        protos, seen = initial_prototypes(state.protos, state.proto_seen, self.num_classes, model.feature_dim,
                                          p.proto_init == "zeros", ctx.device)
        return FRAugWork(msg=msg, ctx=ctx, model=model, gen=gen, rt=rt, protos=protos, seen=seen,
                         cursor=state.proto_cursor, lam_c=lambda_c(ctx.round, ctx.rounds, p.lambda0, p.r0_frac),
                         lam_syn=lambda_syn(ctx.round, ctx.rounds, p.lambda_syn_rate),
                         mix=None if p.syn_mix_rate is None else fl.mix_weight(ctx.round, ctx.rounds, p.syn_mix_rate))

    def passes(self, work: FRAugWork) -> list[LocalPass]:
        """One pass; each step: stage 1 (classifier), then stage 2 (g and m, simultaneously)."""
        p = self.params
        optims = {"model": OptimSpec.from_train(list(work.model.parameters()), self.train_cfg)}
        for slot, net, lr in (("gen", work.gen, p.eta_g), ("rt", work.rt, p.eta_m)):
            if net is not None:
                optims[slot] = OptimSpec(list(net.parameters()), lr=lr, momentum=p.aux_momentum)
        return [LocalPass("local", lambda x, y, opt: self.step(work, x, y, opt), optims, self.train_cfg,
                          modules=(work.model,))]

    def step(self, work: FRAugWork, x: Tensor, y: Tensor, optimizers: Optimizers) -> Tensor:
        """Alg. 1's local step: Eq. (4) on the batch, stage 1 on L_real + L_syn, stage 2; returns stage 1's loss."""
        p, model = self.params, work.model
        u = model.features(x)
        loss = F.cross_entropy(model.head(u), y)
        work.protos, work.seen = update_prototypes(work.protos, work.seen, u.detach(), y, work.lam_c, p.eps,
                                                   p.proto_absent == "skip")
        draws = None
        if len(y) >= 2:  # the generator / RTNet BatchNorm needs two samples
            draws, synthetic = self.augment(work, u, y)  # official mix (user_FRAug.py:182-185): synthetic halved
            loss = loss + synthetic if work.mix is None else (1 - work.mix) * loss + work.mix * synthetic / 2
        optimizers.step(loss, "model")
        if draws is not None:
            u2 = u.detach() if p.stage2_features == "reuse" else \
                fl.features_eval(model, x) if p.stage2_features == "eval" else fl.features_keep_bn(model, x)
            work.totals[1:] += self.stage2(work, u2, y, draws, optimizers)
            work.aug_steps += 1
        work.totals[0] += float(loss.detach())
        return loss

    def augment(self, work: FRAugWork, u: Tensor, y: Tensor) -> tuple[Draws, Tensor]:
        """The step's draws (labels c, z, z') and L_syn on the residuals of the current g and m (Eqs. 2-3)."""
        p, gen, rt, device = self.params, work.gen, work.rt, work.ctx.device
        classes = work.seen.nonzero().flatten() if p.use_ema else work.seen.new_zeros(0, dtype=torch.long)
        labels_c, work.cursor = fl.proto_labels(classes, p.b_syn or len(y), p.b_syn_per_class, p.proto_labels,
                                                work.cursor)
        z = fl.noise(len(y), p.z_dim, p.noise, device) if gen is not None else None
        # z' for the generator; without it, which real class-c embedding (or -1: u_bar_c) m transforms
        z2 = fl.noise(len(labels_c), p.z_dim, p.noise, device) if gen is not None else \
            fl.pick_real(y, labels_c, p.rt_input_c == "batch")
        with torch.no_grad(), fl.eval_mode(*((gen, rt) if p.aux_eval else ())):
            res = fl.residual(gen, rt, z, y, u)
            base_c = fl.rt_source_c(u, work.protos, labels_c, z2) if gen is None else None
            res_c = fl.residual(gen, rt, z2, labels_c, base_c) if len(labels_c) else None
        synthetic = fl.synthetic_loss(work.model.head, u, y, res, work.protos, labels_c, res_c, work.lam_syn,
                                      self.num_classes, p.class_reduction)
        return Draws(labels_c, z, z2), synthetic

    def stage2(self, work: FRAugWork, u: Tensor, y: Tensor, draws: Draws, optimizers: Optimizers) -> Tensor:
        """Eq. (5) -> generator, Eq. (6) -> RTNet (classifier fixed: gradients go to g and m only), both taken
        before either steps. Returns the step's DIAGNOSTICS."""
        p, gen, rt, labels_c = self.params, work.gen, work.rt, draws.labels_c
        sigma = fl.mmd_bandwidth(u, p.mmd_bandwidth, p.mmd_sigma)
        gen_loss = rt_loss = torch.zeros((), device=u.device)
        balanced = p.gen_labels == "balanced" and len(labels_c) > 0  # official: g learns the rotated labels
        v = gen(draws.z, y) if gen is not None else None
        v_c = None
        if gen is not None and len(labels_c) and (rt is not None or balanced):
            with torch.set_grad_enabled(balanced or p.rt_grad_to_generator):
                v_c = gen(draws.z2, labels_c)
        if v is not None:
            g_out, g_y = (v_c, labels_c) if balanced and v_c is not None else (v, y)
            target = work.protos[g_y] if p.gen_distance == "l2" else u  # l2: to the class means (official Digits)
            gen_loss = fl.generator_loss(work.model.head, g_out, g_y, target, p.alpha, sigma, p.gen_distance)
        if rt is None:
            res = work.lam_syn * (v if v is not None else u)
        else:
            res, rt_loss = self.rtnet_terms(work, u, y, draws, v, v_c, sigma)
        losses = {"gen": gen_loss + (rt_loss if p.rt_grad_to_generator else 0.0)} if gen is not None else {}
        if rt is not None:
            losses["rt"] = rt_loss
        optimizers.step_each(losses)
        return fl.step_diagnostics(gen_loss, rt_loss, u, res.detach(), sigma)

    def rtnet_terms(self, work: FRAugWork, u: Tensor, y: Tensor, draws: Draws, v: Tensor | None, v_c: Tensor | None,
                    sigma: Tensor | None) -> tuple[Tensor, Tensor]:
        """(u_hat - u, L_rt): m maps g's outputs v, v_c (the real u / `rt_source_c` without the generator); under
        `aux_eval` it maps g's eval-mode outputs of the same noise (official: g.eval() while m trains)."""
        p, gen, rt, protos, labels_c = self.params, work.gen, work.rt, work.protos, draws.labels_c
        assert rt is not None
        route, lam = p.rt_grad_to_generator, work.lam_syn if p.rt_scale == "lambda_syn" else 1.0
        if p.aux_eval and gen is not None and not route:
            with torch.no_grad(), fl.eval_mode(gen):
                v = gen(draws.z, y)
                v_c = gen(draws.z2, labels_c) if len(labels_c) else None
        src = v if v is not None else u
        res = lam * rt(src if route else src.detach(), y)
        u_hat_c = None
        if len(labels_c):
            src_c = v_c if v_c is not None else fl.rt_source_c(u, protos, labels_c, draws.z2)
            u_hat_c = protos[labels_c] + lam * rt(src_c if route else src_c.detach(), labels_c)
        if p.rt_form == "batch":
            return res, fl.rtnet_loss_batch(work.model.head, u, u + res, protos, labels_c, u_hat_c, p.beta, sigma,
                                            p.rt_distance)
        return res, fl.rtnet_loss(work.model.head, u, y, u + res, protos, labels_c, u_hat_c, p.beta, sigma,
                                  p.proto_mmd, p.class_reduction, p.rt_distance)

    def finish(self, work: FRAugWork, state: FRAugState, stats: FitStats) -> tuple[Message, FRAugState]:
        """FedAvg's reply and local part, plus g; keep m and (`proto_persist`) the prototypes. The reported loss is
        stage 1's mean, with the DIAGNOSTICS' means over the augmented steps."""
        reply, new = super().finish(work, state, stats)
        if work.gen is not None:
            reply.arrays.update({GEN + k: v for k, v in state_of(work.gen).items()})
        reply.scalars["train_loss"] = float(work.totals[0]) / max(stats.steps, 1)
        reply.scalars.update(zip(DIAGNOSTICS, (work.totals[1:] / max(work.aug_steps, 1)).tolist(), strict=True))
        new = dataclasses.replace(new, rtnet=state.rtnet if work.rt is None else state_of(work.rt))
        if self.params.use_ema and self.params.proto_persist:
            new = dataclasses.replace(new, protos=work.protos.cpu(), proto_seen=work.seen.cpu(),
                                      proto_cursor=work.cursor)
        return reply, new
