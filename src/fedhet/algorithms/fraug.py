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

Schedules (dissertation appendix A.2), r = round (1-based), R = rounds:
  lam_c = lambda0 * exp(-5 (1 - r / r0)) for r < r0, else lambda0;  r0 = r0_frac * R
  lam_syn = exp(lambda_syn_rate * (r - R))

Choices the paper leaves open (spec section 2.4), each a `Params` field (default first):
- 2.4.1 stage-2 gradient routing: `rt_grad_to_generator=False`: omega <- grad L_gen only, phi <- grad L_rt only
  (the RTNet sees g's output detached); both gradients are computed before either step (simultaneous update).
- 2.4.2 stage-2 embeddings: `stage2_features="reuse"` (the stage-1 u, detached) | "recompute" (f(x) again with
  the stage-1-updated extractor, in train mode, BN running statistics left untouched).
- 2.4.3 z' and the prototype MMD: `b_syn` prototype-based synthetic embeddings per step, classes dealt round-robin
  (`b_syn_per_class=True`: b_syn per class); `proto_mmd="prototype"` treats u_bar_c as a one-sample set,
  "real" compares with the batch's real class-c embeddings (falling back to u_bar_c when none).
  MMD: `fedhet.losses.gaussian_mmd`, the biased squared MMD with a Gaussian kernel, bandwidth `mmd_sigma`
  (None: median heuristic, detached).
- 2.4.4 generator / RTNet: appendix Tabs. 4-5 (`fedhet.models.fraug_nets`); d_z = `z_dim`; one-hot labels.
- 2.4.5 head: the model's `head` (SplitModel split), u = `features(x)`.
- 2.4.6 optimizers: classifier from the train config; g and m plain SGD (lr eta_g / eta_m, momentum
  `aux_momentum`), fresh each round. Sums over classes: per-class means, summed (`class_reduction="sum"`,
  literal) or averaged ("mean"). Entropy: `fedhet.losses.softmax_entropy` (nats, batch mean).
  Prototypes: `proto_init="first"` (a class's first batch mean; classes never seen are left out of the u_hat_c
  terms) | "zeros" (all classes from the start); `proto_absent="skip"` (absent classes keep their prototype) |
  "literal" (Eq. 4 as printed pulls them towards 0); `proto_persist=True` keeps them across rounds; eps = `eps`.
- 2.4.7 ablations (Table 5): `use_generator`, `use_rtnet`, `use_ema`. Without the generator the RTNet maps
  eps ~ N(0, I_{d_u}) (no generator is trained or sent); without the RTNet the residual is g(z, y) itself.
- 2.4.8 evaluation: as FedBN here: after aggregation, the round's shared classifier with the client's local BN.
- 2.4.9 reported round: every evaluated round is logged; the report's choice applies.
Aggregation: uniform per Alg. 1 when `server.aggregation: uniform` (FRAug's configs); the setting is respected.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.algorithms.base import Algorithm, ClientContext, ClientState, ServerState
from fedhet.algorithms.registry import register
from fedhet.engine.local import batches, check_finite, make_optimizer, optimizer_step
from fedhet.engine.messages import Message
from fedhet.engine.params import BN_TYPES, keys_of_types, state_of
from fedhet.errors import ConfigError
from fedhet.losses import gaussian_mmd, softmax_entropy
from fedhet.models.fraug_nets import Generator, RTNet

GEN = "gen/"
CHOICES = {"proto_mmd": ("prototype", "real"), "proto_init": ("first", "zeros"), "proto_absent": ("skip", "literal"),
           "class_reduction": ("sum", "mean"), "stage2_features": ("reuse", "recompute")}


def lambda_c(rnd: int, rounds: int, lambda0: float = 0.3, r0_frac: float = 0.05) -> float:
    """EMA ratio of the prototypes: exponential ramp-up to lambda0 over the first r0 = r0_frac * R rounds."""
    r0 = r0_frac * rounds
    return lambda0 * math.exp(-5.0 * (1.0 - rnd / r0)) if rnd < r0 else lambda0


def lambda_syn(rnd: int, rounds: int, rate: float = 0.01) -> float:
    """Weight of the generated residuals: exp(rate * (r - R)), reaching 1 at the last round."""
    return math.exp(rate * (rnd - rounds))


def per_class(values: torch.Tensor, labels: torch.Tensor, num_classes: int, how: str = "sum") -> torch.Tensor:
    """Per-class means of per-sample values, summed (Eq. 2 / 6's sum over c) or averaged over present classes."""
    sums = torch.zeros(num_classes, dtype=values.dtype, device=values.device).index_add(0, labels, values)
    counts = torch.bincount(labels, minlength=num_classes)
    means = sums[counts > 0] / counts[counts > 0]
    return means.sum() if how == "sum" else means.mean()


def update_prototypes(protos: torch.Tensor, seen: torch.Tensor, u: torch.Tensor, y: torch.Tensor, lam: float,
                      eps: float = 1e-6, skip_absent: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (4) on a batch (u detached): new (prototypes C x d, seen flags C). A class seen for the first time
    takes its batch mean; absent classes keep their prototype (`skip_absent`) or decay towards 0 (literal)."""
    onehot = F.one_hot(y, protos.shape[0]).to(u.dtype)
    sums, counts = onehot.T @ u, onehot.sum(0)
    present = counts > 0
    means = torch.where(present[:, None], sums / (counts + eps).clamp_min(1e-12)[:, None], 0.0)
    new = (1 - lam) * protos + lam * means
    new = torch.where((present & ~seen)[:, None], sums / counts.clamp_min(1)[:, None], new)
    update = present | (seen & (not skip_absent))
    return torch.where(update[:, None], new, protos), seen | present


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
        lambda0: float = 0.3
        r0_frac: float = 0.05
        lambda_syn_rate: float = 0.01
        eps: float = 1e-6
        mmd_sigma: float | None = None
        proto_mmd: str = "prototype"
        proto_init: str = "first"
        proto_absent: str = "skip"
        proto_persist: bool = True
        class_reduction: str = "sum"
        stage2_features: str = "reuse"
        rt_grad_to_generator: bool = False
        use_generator: bool = True
        use_rtnet: bool = True
        use_ema: bool = True

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
            if self.mmd_sigma is not None and not self.mmd_sigma > 0:
                raise ConfigError(f"fraug: mmd_sigma must be > 0 or null, got {self.mmd_sigma}")
            if not (self.use_generator or self.use_rtnet):
                raise ConfigError("fraug: use_generator and use_rtnet cannot both be false (no residuals; use fedbn)")

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

    # ------------------------------------------------------------------ losses
    def synthetic_loss(self, head: nn.Module, u: torch.Tensor, y: torch.Tensor, res: torch.Tensor,
                       protos: torch.Tensor, labels_c: torch.Tensor, res_c: torch.Tensor | None,
                       lam_syn: float) -> torch.Tensor:
        """Eq. (2)-(3) with every input detached, so the gradient reaches the head only."""
        loss = F.cross_entropy(head(u.detach() + lam_syn * res.detach()), y)
        if res_c is not None and len(labels_c):
            u_hat_c = protos.detach()[labels_c] + lam_syn * res_c.detach()
            ce = F.cross_entropy(head(u_hat_c), labels_c, reduction="none")
            loss = loss + per_class(ce, labels_c, self.num_classes, self.params.class_reduction)
        return loss

    def mmd(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return gaussian_mmd(x, y, self.params.mmd_sigma)

    def rtnet_loss(self, head: nn.Module, u: torch.Tensor, y: torch.Tensor, u_hat: torch.Tensor,
                   protos: torch.Tensor, labels_c: torch.Tensor, u_hat_c: torch.Tensor | None) -> torch.Tensor:
        """Eq. (6): -Ent(h(u_hat)) - sum_c Ent(h(u_hat_c)) + beta (MMD(u_hat, u) + sum_c MMD(u_hat_c, u_bar_c))."""
        p = self.params
        loss = -softmax_entropy(head(u_hat)) + p.beta * self.mmd(u_hat, u)
        if u_hat_c is None or not len(labels_c):
            return loss
        logits_c, ents, mmds = head(u_hat_c), [], []
        for c in labels_c.unique():
            mask = labels_c == c
            real = u[y == c] if p.proto_mmd == "real" else u[:0]
            ents.append(softmax_entropy(logits_c[mask]))
            mmds.append(self.mmd(u_hat_c[mask], real if len(real) else protos[c][None]))
        total = torch.stack(ents) - p.beta * torch.stack(mmds)
        return loss - (total.sum() if p.class_reduction == "sum" else total.mean())

    # ------------------------------------------------------------------ client side
    def residual(self, gen: nn.Module | None, rt: nn.Module | None, z: torch.Tensor, y: torch.Tensor,
                 into_generator: bool = False) -> torch.Tensor:
        """m(g(z, y)); g(z, y) without the RTNet; m(z) without the generator (z ~ N(0, I_{d_u}) then)."""
        v = gen(z, y) if gen is not None else z
        return v if rt is None else rt(v if into_generator else v.detach())

    def _proto_labels(self, seen: torch.Tensor) -> torch.Tensor:
        """The labels c of the prototype-based synthetic embeddings (empty without EMA)."""
        classes = seen.nonzero().flatten() if self.params.use_ema else seen.new_zeros(0, dtype=torch.long)
        if not len(classes):
            return classes
        if self.params.b_syn_per_class:
            return classes.repeat_interleave(self.params.b_syn)
        return classes[torch.arange(self.params.b_syn, device=classes.device) % len(classes)]

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
        lam_c = lambda_c(ctx.round, rounds, p.lambda0, p.r0_frac)
        lam_s = lambda_syn(ctx.round, rounds, p.lambda_syn_rate)
        opt = make_optimizer(model.parameters(), cfg)
        if cfg.persist_optimizer and "optim" in state:
            opt.load_state_dict(copy.deepcopy(state["optim"]))  # torch aliases the loaded buffers
        aux = [torch.optim.SGD(net.parameters(), lr=lr, momentum=p.aux_momentum)
               for net, lr in ((gen, p.eta_g), (rt, p.eta_m)) if net is not None]
        model.train()
        totals, steps = torch.zeros(3), 0
        for x, y in batches(ctx.data.train, cfg, device=ctx.device):
            u = model.features(x)
            loss = F.cross_entropy(model.head(u), y)
            protos, seen = update_prototypes(protos, seen, u.detach(), y, lam_c, p.eps, p.proto_absent == "skip")
            aug = len(y) >= 2  # the generator / RTNet BatchNorm needs two samples
            if aug:
                z = torch.randn(len(y), p.z_dim if gen is not None else model.feature_dim, device=ctx.device)
                labels_c = self._proto_labels(seen)
                z2 = torch.randn(len(labels_c), z.shape[1], device=ctx.device)
                with torch.no_grad():
                    res = self.residual(gen, rt, z, y)
                    res_c = self.residual(gen, rt, z2, labels_c) if len(labels_c) else None
                loss = loss + self.synthetic_loss(model.head, u, y, res, protos, labels_c, res_c, lam_s)
            optimizer_step(model, opt, loss, f"{self.name} client {ctx.client_id} round {ctx.round}",
                           self.train_cfg.grad_clip)
            if aug:
                u2 = u.detach() if p.stage2_features == "reuse" else self._features_keep_bn(model, x)
                totals[1:] += self._stage2(model.head, gen, rt, aux, u2, y, z, z2, protos, labels_c, lam_s)
            totals[0] += float(loss.detach())
            steps += 1
        if cfg.persist_optimizer:
            state["optim"] = copy.deepcopy(opt.state_dict())
        state["local"] = state_of(model, self.local_keys())
        if rt is not None:
            state["rtnet"] = state_of(rt)
        if p.use_ema and p.proto_persist:
            state["protos"], state["proto_seen"] = protos.cpu(), seen.cpu()
        arrays = state_of(model, self._shared)
        if gen is not None:
            arrays.update({GEN + k: v for k, v in state_of(gen).items()})
        mean = (totals / max(steps, 1)).tolist()
        return Message(arrays=arrays, scalars={"train_loss": mean[0], "gen_loss": mean[1], "rt_loss": mean[2],
                                               "steps": steps}), state

    def _prototypes(self, state: ClientState, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if "protos" in state:
            return state["protos"].to(device), state["proto_seen"].to(device)
        zeros = self.params.proto_init == "zeros"
        return (torch.zeros(self.num_classes, dim, device=device),
                torch.full((self.num_classes,), zeros, dtype=torch.bool, device=device))

    @staticmethod
    @torch.no_grad()
    def _features_keep_bn(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """f(x) in train mode with the BatchNorm running statistics restored afterwards."""
        saved = [b.clone() for b in model.buffers()]
        u = model.features(x)
        for b, s in zip(model.buffers(), saved, strict=True):
            b.copy_(s)
        return u

    def _stage2(self, head: nn.Module, gen: nn.Module | None, rt: nn.Module | None, aux: list,
                u: torch.Tensor, y: torch.Tensor, z: torch.Tensor, z2: torch.Tensor, protos: torch.Tensor,
                labels_c: torch.Tensor, lam_s: float) -> torch.Tensor:
        """Eq. (5) -> generator, Eq. (6) -> RTNet (classifier fixed: gradients go to g and m only)."""
        p, route = self.params, self.params.rt_grad_to_generator
        gen_loss = rt_loss = torch.zeros((), device=u.device)
        v = None
        if gen is not None:
            v = gen(z, y)
            gen_loss = F.cross_entropy(head(v), y) - p.alpha * self.mmd(v, u)
        if rt is not None:
            u_hat = u + lam_s * rt((v if route else v.detach()) if v is not None else z)
            u_hat_c = None
            if len(labels_c):
                with torch.set_grad_enabled(route):
                    v_c = gen(z2, labels_c) if gen is not None else z2
                u_hat_c = protos[labels_c] + lam_s * rt(v_c if route else v_c.detach())
            rt_loss = self.rtnet_loss(head, u, y, u_hat, protos, labels_c, u_hat_c)
        objectives = [gen_loss + (rt_loss if route else 0.0)] if gen is not None else []
        objectives += [rt_loss] if rt is not None else []
        nets = [net for net in (gen, rt) if net is not None]
        for obj in objectives:
            check_finite(obj, f"{self.name} stage 2")
        grads = [torch.autograd.grad(obj, list(net.parameters()), retain_graph=True, allow_unused=True)
                 for obj, net in zip(objectives, nets, strict=True)]
        for opt, net, gs in zip(aux, nets, grads, strict=True):
            for param, g in zip(net.parameters(), gs, strict=True):
                param.grad = g
            opt.step()
        return torch.stack([gen_loss.detach(), rt_loss.detach()]).cpu()
