"""FRAug (Chen, Frikha, Krompass, Gu, Tresp, ICCV 2023): federated representation augmentation.

Each client k holds a classifier f^k/h^k (shared, averaged like FedBN: BatchNorm stays local), a copy of the
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

Schedules lam_c, lam_syn (appendix A.2) and the losses: `fedhet.algorithms.fraug_losses`. Choices the paper
leaves open (spec 2.4; each a `Params` field, docs/fraug.md has the reasons):
- stage 2: `rt_grad_to_generator` (False: omega <- grad L_gen, phi <- grad L_rt, simultaneous); `stage2_features`
  ("reuse" the stage-1 u detached | "recompute").
- u_hat_c: `b_syn` in total (`b_syn_per_class`: per class), classes dealt round-robin over steps and rounds
  (`proto_labels="rotate"`) or drawn uniformly ("random"); `proto_mmd` ("prototype": u_bar_c as a one-sample
  set | "real" class-c embeddings of the batch). Sums over classes: per-class means, averaged
  (`class_reduction="mean"`: the appendix's single B_syn fits one mean-reduced loss) or summed ("sum", literal).
- MMD: biased Gaussian-kernel MMD^2; bandwidth `mmd_bandwidth` "pooled" (median heuristic over each MMD's pooled
  sample; the measured choice, docs/fraug.md) | "real" (median distance among the batch's real u) | "fixed"
  (`mmd_sigma`).
- g, m: appendix Tabs. 4-5 (`fedhet.models.fraug_nets`), SGD (eta_g / eta_m, `aux_momentum`), fresh each round.
  Prototypes: `proto_init`, `proto_absent`, `proto_persist`, `eps`.
- ablations (Table 5): `use_generator`, `use_rtnet`, `use_ema`. Without the generator the RTNet maps real
  embeddings: u_hat = u + lam_syn m(u), u_hat_c = u_bar_c + lam_syn m(u_i) with u_i a random real class-c
  embedding of the batch (`rt_input_c="batch"`; u_bar_c when none) or m(u_bar_c) ("prototype"); without the
  RTNet the residual is g(z, y) itself.
- evaluation as FedBN: the round's shared classifier with the client's local BN.
Aggregation: uniform per Alg. 1 when `server.aggregation: uniform` (FRAug's configs); the setting is respected.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.algorithms import fraug_losses as fl
from fedhet.algorithms.base import Algorithm, ClientContext, ClientState, ServerState
from fedhet.algorithms.fraug_losses import lambda_c, lambda_syn, update_prototypes
from fedhet.algorithms.registry import register
from fedhet.engine.local import batches, check_finite, make_optimizer, optimizer_step
from fedhet.engine.messages import Message, Scalar
from fedhet.engine.params import BN_TYPES, keys_of_types, state_of
from fedhet.errors import ConfigError
from fedhet.models import SplitModel
from fedhet.models.fraug_nets import Generator, RTNet

GEN = "gen/"
CHOICES = {"proto_mmd": ("prototype", "real"), "proto_init": ("first", "zeros"), "proto_absent": ("skip", "literal"),
           "class_reduction": ("mean", "sum"), "stage2_features": ("reuse", "recompute"),
           "proto_labels": fl.LABEL_DRAWS, "mmd_bandwidth": fl.BANDWIDTHS, "rt_input_c": fl.RT_INPUTS_C}
DIAGNOSTICS = ("gen_loss", "rt_loss", "mmd_rt", "res_norm", "u_norm", "sigma")


@register
class FRAug(Algorithm):
    """Shared generator + local RTNet + EMA prototypes augment the head's training in the embedding space."""

    name = "fraug"
    personalized = True

    @dataclass
    class Params:
        """Defaults: the appendix's Digits column (d_z 256, eta_g = eta_m = 0.005, alpha 1, beta 1.5, B_syn 64)."""

        z_dim: int = 256
        eta_g: float = 0.005
        eta_m: float = 0.005
        aux_momentum: float = 0.5
        alpha: float = 1.0
        beta: float = 1.5
        b_syn: int = 64
        b_syn_per_class: bool = False
        proto_labels: str = "rotate"
        lambda0: float = 0.3
        r0_frac: float = 0.05
        lambda_syn_rate: float = 0.01
        eps: float = 1e-6
        mmd_bandwidth: str = "pooled"
        mmd_sigma: float | None = None
        proto_mmd: str = "prototype"
        proto_init: str = "first"
        proto_absent: str = "skip"
        proto_persist: bool = True
        class_reduction: str = "mean"
        stage2_features: str = "reuse"
        rt_grad_to_generator: bool = False
        use_generator: bool = True
        use_rtnet: bool = True
        use_ema: bool = True
        rt_input_c: str = "batch"

        def validate(self) -> None:
            for key, choices in CHOICES.items():
                if getattr(self, key) not in choices:
                    raise ConfigError(f"fraug: {key} must be one of {', '.join(choices)}, got {getattr(self, key)!r}")
            positive = {"z_dim": self.z_dim, "eta_g": self.eta_g, "eta_m": self.eta_m, "eps": self.eps}
            for key, value in positive.items():
                if not value > 0:
                    raise ConfigError(f"fraug: {key} must be > 0, got {value}")
            if self.b_syn < 2:
                raise ConfigError(f"fraug: b_syn must be >= 2 (the generator has BatchNorm), got {self.b_syn}")
            if min(self.alpha, self.beta, self.lambda_syn_rate, self.r0_frac) < 0 or not 0 <= self.aux_momentum < 1:
                raise ConfigError("fraug: alpha, beta, lambda_syn_rate, r0_frac must be >= 0, aux_momentum in [0, 1)")
            if not 0 < self.lambda0 <= 1:
                raise ConfigError(f"fraug: lambda0 must be in (0, 1], got {self.lambda0}")
            self._validate_bandwidth()
            if not (self.use_generator or self.use_rtnet):
                raise ConfigError("fraug: use_generator and use_rtnet cannot both be false (no residuals; use fedbn)")

        def _validate_bandwidth(self) -> None:
            if self.mmd_bandwidth == "fixed" and (self.mmd_sigma is None or not self.mmd_sigma > 0):
                raise ConfigError(f"fraug: mmd_bandwidth fixed needs mmd_sigma > 0, got {self.mmd_sigma}")
            if self.mmd_bandwidth != "fixed" and self.mmd_sigma is not None:
                raise ConfigError(f"fraug: mmd_sigma is used only with mmd_bandwidth: fixed (got mmd_bandwidth "
                                  f"{self.mmd_bandwidth!r}); set mmd_bandwidth=fixed or drop mmd_sigma")

    def shared_keys(self, model: nn.Module) -> set[str]:
        return set(model.state_dict()) - keys_of_types(model, BN_TYPES)  # FedBN: BatchNorm stays local

    # ------------------------------------------------------------------ networks
    def new_generator(self) -> Generator:
        return Generator(self.params.z_dim, self.num_classes, self._template.feature_dim).to(self.device)

    def new_rtnet(self) -> RTNet:
        return RTNet(self._template.feature_dim, self.params.z_dim).to(self.device)

    def _load(self, slot: str, weights: dict[str, torch.Tensor] | None) -> nn.Module:
        """The reused network of `slot`, loaded with `weights` (None: freshly random-initialised, global RNG)."""
        nets = self.__dict__.setdefault("_nets", {})
        if weights is None or slot not in nets:
            nets[slot] = self.new_generator() if slot == "gen" else self.new_rtnet()
        if weights is not None:
            nets[slot].load_state_dict(weights)
        return nets[slot].train()

    def init_server(self) -> ServerState:
        server = super().init_server()
        if self.params.use_generator:
            server["global"].update({GEN + k: v for k, v in state_of(self.new_generator()).items()})
        return server

    # ------------------------------------------------------------------ losses (fedhet.algorithms.fraug_losses)
    def synthetic_loss(self, head: nn.Module, u: torch.Tensor, y: torch.Tensor, res: torch.Tensor,
                       protos: torch.Tensor, labels_c: torch.Tensor, res_c: torch.Tensor | None,
                       lam_syn: float) -> torch.Tensor:
        """Eqs. (2)-(3) with every input detached, so the gradient reaches the head only."""
        return fl.synthetic_loss(head, u, y, res, protos, labels_c, res_c, lam_syn, self.num_classes,
                                 self.params.class_reduction)

    def rtnet_loss(self, head: nn.Module, u: torch.Tensor, y: torch.Tensor, u_hat: torch.Tensor,
                   protos: torch.Tensor, labels_c: torch.Tensor, u_hat_c: torch.Tensor | None,
                   sigma: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. (6) with this run's beta, prototype-MMD choice and class reduction."""
        p = self.params
        return fl.rtnet_loss(head, u, y, u_hat, protos, labels_c, u_hat_c, p.beta, sigma, p.proto_mmd,
                             p.class_reduction)

    # ------------------------------------------------------------------ client side
    @staticmethod
    def residual(gen: nn.Module | None, rt: nn.Module | None, z: torch.Tensor | None, y: torch.Tensor,
                 base: torch.Tensor | None, into_generator: bool = False) -> torch.Tensor:
        """m(g(z, y)); g(z, y) without the RTNet; m(base) without the generator (base: u, or u_hat_c's source)."""
        v = gen(z, y) if gen is not None else base.detach()  # type: ignore[union-attr]
        return v if rt is None else rt(v if into_generator else v.detach())

    def _proto_labels(self, seen: torch.Tensor, cursor: int = 0) -> tuple[torch.Tensor, int]:
        """The labels c of this step's prototype-based synthetic embeddings (empty without EMA), next cursor."""
        p = self.params
        classes = seen.nonzero().flatten() if p.use_ema else seen.new_zeros(0, dtype=torch.long)
        return fl.proto_labels(classes, p.b_syn, p.b_syn_per_class, p.proto_labels, cursor)
    def fit(self, msg: Message, state: ClientState, ctx: ClientContext) -> tuple[Message, ClientState]:
        state, p, cfg = dict(state), self.params, self.train_cfg
        if "rounds" not in ctx.extra:
            raise ValueError("fraug needs ctx.extra['rounds'] (the run's R) for its schedules")
        rounds = int(ctx.extra["rounds"])
        model = self.client_model(msg, state)
        gen = self._load("gen", {k[len(GEN):]: v for k, v in msg.arrays.items() if k.startswith(GEN)}
                         ) if p.use_generator else None
        rt = self._load("rt", state.get("rtnet")) if p.use_rtnet else None
        protos, seen = self._prototypes(state, model.feature_dim, ctx.device)
        cursor = int(state.get("proto_cursor", 0))
        lam_c = lambda_c(ctx.round, rounds, p.lambda0, p.r0_frac)
        lam_s = lambda_syn(ctx.round, rounds, p.lambda_syn_rate)
        opt = make_optimizer(model.parameters(), cfg)
        if cfg.persist_optimizer and "optim" in state:
            opt.load_state_dict(copy.deepcopy(state["optim"]))  # torch aliases the loaded buffers
        aux = [torch.optim.SGD(net.parameters(), lr=lr, momentum=p.aux_momentum)
               for net, lr in ((gen, p.eta_g), (rt, p.eta_m)) if net is not None]
        model.train()
        totals, steps, aug_steps = torch.zeros(1 + len(DIAGNOSTICS)), 0, 0
        for x, y in batches(ctx.data.train, cfg, device=ctx.device):
            u = model.features(x)
            loss = F.cross_entropy(model.head(u), y)
            protos, seen = update_prototypes(protos, seen, u.detach(), y, lam_c, p.eps, p.proto_absent == "skip")
            aug = len(y) >= 2  # the generator / RTNet BatchNorm needs two samples
            if aug:
                labels_c, cursor = self._proto_labels(seen, cursor)
                z = torch.randn(len(y), p.z_dim, device=ctx.device) if gen is not None else None
                # z' for the generator; without it, which real class-c embedding (or -1: u_bar_c) m transforms
                z2 = torch.randn(len(labels_c), p.z_dim, device=ctx.device) if gen is not None else \
                    fl.pick_real(y, labels_c, p.rt_input_c == "batch")
                with torch.no_grad():
                    res = self.residual(gen, rt, z, y, u)
                    base_c = fl.rt_source_c(u, protos, labels_c, z2) if gen is None else None
                    res_c = self.residual(gen, rt, z2, labels_c, base_c) if len(labels_c) else None
                loss = loss + self.synthetic_loss(model.head, u, y, res, protos, labels_c, res_c, lam_s)
            optimizer_step(model, opt, loss, f"{self.name} client {ctx.client_id} round {ctx.round}",
                           self.train_cfg.grad_clip)
            if aug:
                u2 = u.detach() if p.stage2_features == "reuse" else self._features_keep_bn(model, x)
                totals[1:] += self._stage2(model.head, gen, rt, aux, u2, y, z, z2, protos, labels_c, lam_s)
                aug_steps += 1
            totals[0] += float(loss.detach())
            steps += 1
        if cfg.persist_optimizer:
            state["optim"] = copy.deepcopy(opt.state_dict())
        state["local"] = state_of(model, self.local_keys())
        if rt is not None:
            state["rtnet"] = state_of(rt)
        if p.use_ema and p.proto_persist:
            state["protos"], state["proto_seen"] = protos.cpu(), seen.cpu()
            state["proto_cursor"] = torch.tensor(cursor)
        arrays = state_of(model, self._shared)
        if gen is not None:
            arrays.update({GEN + k: v for k, v in state_of(gen).items()})
        scalars: dict[str, Scalar] = {"train_loss": float(totals[0]) / max(steps, 1), "steps": steps}
        scalars.update(zip(DIAGNOSTICS, (totals[1:] / max(aug_steps, 1)).tolist(), strict=True))
        return Message(arrays=arrays, scalars=scalars), state

    def _prototypes(self, state: ClientState, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if "protos" in state:
            return state["protos"].to(device), state["proto_seen"].to(device)
        zeros = self.params.proto_init == "zeros"
        return (torch.zeros(self.num_classes, dim, device=device),
                torch.full((self.num_classes,), zeros, dtype=torch.bool, device=device))

    @staticmethod
    @torch.no_grad()
    def _features_keep_bn(model: SplitModel, x: torch.Tensor) -> torch.Tensor:
        """f(x) in train mode with the BatchNorm running statistics restored afterwards."""
        saved = [b.clone() for b in model.buffers()]
        u = model.features(x)
        for b, s in zip(model.buffers(), saved, strict=True):
            b.copy_(s)
        return u

    def _stage2(self, head: nn.Module, gen: nn.Module | None, rt: nn.Module | None, aux: list,
                u: torch.Tensor, y: torch.Tensor, z: torch.Tensor | None, z2: torch.Tensor,
                protos: torch.Tensor, labels_c: torch.Tensor, lam_s: float) -> torch.Tensor:
        """Eq. (5) -> generator, Eq. (6) -> RTNet (classifier fixed: gradients go to g and m only).
        Returns the step's DIAGNOSTICS (losses, unweighted MMD(u_hat, u), mean norms of the residual and u)."""
        p, route = self.params, self.params.rt_grad_to_generator
        sigma = fl.mmd_bandwidth(u, p.mmd_bandwidth, p.mmd_sigma)
        gen_loss = rt_loss = torch.zeros((), device=u.device)
        v = gen(z, y) if gen is not None else None
        if v is not None:
            gen_loss = fl.generator_loss(head, v, y, u, p.alpha, sigma)
        src = v if v is not None else u  # the RTNet's input: g(z, y), or the real u without the generator
        res = lam_s * (src if rt is None else rt(src if route else src.detach()))
        if rt is not None:
            u_hat_c = None
            if len(labels_c):
                with torch.set_grad_enabled(route):
                    src_c = gen(z2, labels_c) if gen is not None else fl.rt_source_c(u, protos, labels_c, z2)
                u_hat_c = protos[labels_c] + lam_s * rt(src_c if route else src_c.detach())
            rt_loss = self.rtnet_loss(head, u, y, u + res, protos, labels_c, u_hat_c, sigma)
        nets = [net for net in (gen, rt) if net is not None]
        objectives = [gen_loss + (rt_loss if route else 0.0)] if gen is not None else []
        objectives += [rt_loss] if rt is not None else []
        for obj in objectives:
            check_finite(obj, f"{self.name} stage 2")
        grads = [torch.autograd.grad(obj, list(net.parameters()), retain_graph=True, allow_unused=True)
                 for obj, net in zip(objectives, nets, strict=True)]
        for opt, net, gs in zip(aux, nets, grads, strict=True):
            for param, g in zip(net.parameters(), gs, strict=True):
                param.grad = g
            opt.step()
        return self._diagnostics(gen_loss, rt_loss, u, res.detach(), sigma)

    @staticmethod
    @torch.no_grad()
    def _diagnostics(gen_loss: torch.Tensor, rt_loss: torch.Tensor, u: torch.Tensor, res: torch.Tensor,
                     sigma: torch.Tensor | None) -> torch.Tensor:
        s = fl.median_heuristic_sigma(u + res, u) if sigma is None else sigma
        mmd = fl.gaussian_mmd(u + res, u, s)
        norms = res.norm(dim=1).mean(), u.norm(dim=1).mean()
        return torch.stack([gen_loss.detach(), rt_loss.detach(), mmd, *norms, s.reshape(())]).float().cpu()
