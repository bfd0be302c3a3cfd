"""DENSE (Zhang et al., NeurIPS 2022, "DENSE: Data-Free One-Shot Federated Learning"), the one-shot baseline of
FedBiP's Tables 1-2 ("client local models are uploaded and distilled into one model using synthetic images"; spec
fedbip.md, baselines), read with the official code (zj-jayzhang/DENSE: loop_df_fl.py, helpers/synthesizers.py).

Client, once: the run's model, from the common initial model, trains `local_epochs` on the local data (the train
section's optimizer) and goes up whole (parameters and BN statistics); scalars: its input shape (metadata).
Server: the teacher is the ensemble D of the client models (mean logits; `dense_parts.Ensemble`), never their
average. For each of `server_epochs` epochs (official `--epochs`):
1. data generation: the generator G (re-initialised, `reset_generator`) and its codes z (N(0, I),
   `synthesis_batch_size`) take `g_steps` Adam steps (lr `lr_g`, betas (0.5, 0.999)) on
       L_G = oh · CE(D(x̂), ŷ) + bn · R_BN(x̂) + adv · L_adv(x̂),   x̂ = aug(G(z)), ŷ ~ U{classes} (sorted)
   (R_BN: BN-statistics matching over the client models; L_adv: −KL(D ‖ f_S) where student and teacher disagree;
   `dense_parts`); the batch with the lowest L_G goes into the pool;
2. distillation: the student f_S (the initial model) descends KL(D(x̂) ‖ f_S(x̂)) · T² over the whole pool
   (batches of `kd_batch_size`, SGD lr `kd_lr`, momentum 0.9, the optimizer kept across epochs).
The student is deployed to every client. Generated images are in [0, 1] and reach the models through the
clients' normalisation (`normalize`, FedBiP's `ImageFormat`).

**Simplified** (labelled, switches): the official run is 200 epochs of 30 generator steps on batches of 256 with
`ngf` 64 and `nz` 256; the defaults here are a CPU-test size and `server_epochs`, `g_steps`, `synthesis_batch_size`,
`kd_batch_size`, `ngf` and `nz` set them (configs/fedbip/feature_shift.yaml names its own); the synthesis view
(`augment`) is one random shift and flip per batch (official: kornia's per-image crop and flip, plus a second
"local" view it does not use); no augmentation of the pool during distillation (official: a random flip).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.algorithms.base import Algorithm
from fedhet.algorithms.dense_parts import BNStatistics, Ensemble, Generator, adversarial_loss, augment, kd_loss
from fedhet.algorithms.fedbip_parts import ImageFormat
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientState, FitStats, LocalPass, RoundInfo, ServerState, Work, loss_pass
from fedhet.core.messages import Message, Reply
from fedhet.core.params import state_of
from fedhet.core.seeding import torch_generator
from fedhet.errors import ConfigError
from fedhet.losses.descent import descend

log = logging.getLogger(__name__)
GEOMETRY = ("channels", "height", "width")  # reply scalars: the client's input shape


@dataclass
class DenseParams:
    """Local training (`local_epochs`, official parser default 100, its README runs 400; `train.local_steps`, when
    set, bounds it instead) and the server's data generation and distillation. **Defaults sized for a CPU test
    (simplified, labelled)**; the official values (README's run, parser defaults) in brackets: `server_epochs` 5
    [200], `g_steps` 10 [30], `synthesis_batch_size` 32 [256], `kd_batch_size` 32 [256], `nz` 64 [256], `ngf` 16
    [64]; as official: `lr_g` 1e-3, `kd_lr` 0.005, `temperature` T 20, the loss weights `oh` / `bn` / `adv` 1,
    `reset_generator` (G re-initialised every epoch) and `augment` (the synthesis view, simplified: module doc).
    The clients' input normalisation: `normalize` imagenet | none | fixed with `mean` / `std` (as FedBiP's)."""

    local_epochs: int = 100
    server_epochs: int = 5
    g_steps: int = 10
    synthesis_batch_size: int = 32
    kd_batch_size: int = 32
    nz: int = 64
    ngf: int = 16
    lr_g: float = 1e-3
    kd_lr: float = 0.005
    temperature: float = 20.0
    oh: float = 1.0
    bn: float = 1.0
    adv: float = 1.0
    reset_generator: bool = True
    augment: bool = True
    normalize: str = "imagenet"
    mean: list[float] | None = None
    std: list[float] | None = None

    def validate(self) -> None:
        for name in ("local_epochs", "g_steps", "synthesis_batch_size", "kd_batch_size", "nz", "ngf"):
            if getattr(self, name) < 1:
                raise ConfigError(f"dense method_args.{name} must be >= 1, got {getattr(self, name)}")
        if self.server_epochs < 0:
            raise ConfigError(f"dense method_args.server_epochs must be >= 0, got {self.server_epochs}")
        for name in ("lr_g", "kd_lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"dense method_args.{name} must be > 0, got {getattr(self, name)}")
        for name in ("oh", "bn", "adv"):
            if getattr(self, name) < 0:
                raise ConfigError(f"dense method_args.{name} must be >= 0, got {getattr(self, name)}")
        self.image_format()

    def image_format(self) -> ImageFormat:
        """How the clients' inputs relate to [0, 1] images."""
        return ImageFormat.of(self.normalize, self.mean, self.std)


@dataclass(kw_only=True)
class DenseServer(ServerState):
    """`synthetic`: the pool's size once the server step is done (0 before); `losses`: the last epoch's mean
    generator terms and distillation loss."""

    synthetic: int = 0
    losses: dict[str, float] = dataclasses.field(default_factory=dict)

    def facts(self) -> dict[str, Any]:  # Any: JSON facts
        return {"dense": {"synthetic": self.synthetic, "losses": dict(self.losses)}} if self.synthetic else {}


@register
class Dense(Algorithm[DenseServer, ClientState, Work, DenseParams]):
    """One upload of a locally trained model per client; the server distils their ensemble with generated data."""

    name = "dense"
    Params = DenseParams
    one_shot = True
    server_state_type = DenseServer
    client_state_type = ClientState
    work_type = Work

    # ------------------------------------------------------------------ client side
    def passes(self, work: Work) -> list[LocalPass]:
        """Local training of the whole model for `local_epochs` (the official LocalUpdate)."""
        train = dataclasses.replace(self.train_cfg, local_epochs=self.params.local_epochs)
        return [loss_pass(work.model, lambda x, y: self.loss(work, x, y), train)]

    def finish(self, work: Work, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        """The one upload: the trained model; scalars: the training loss, steps and the input shape."""
        msg = self.parts.reply(work.model, stats)
        shape = tuple(work.ctx.data.train_eval[0][0].shape)
        if len(shape) != 3:
            raise ConfigError(f"dense needs image inputs (C, H, W), got shape {shape}")
        return Message(arrays=msg.arrays, scalars={**msg.scalars, **dict(zip(GEOMETRY, shape, strict=True))}), state

    # ------------------------------------------------------------------ server side
    def broadcast(self, server: DenseServer, info: RoundInfo, client_id: int) -> Message:
        """The initial model before the server step (every client starts from it), the student after it."""
        if info.round != 1:
            raise ConfigError(f"dense is one-shot: it runs round 1 only, not round {info.round} (set rounds=1)")
        return Message(arrays=server.model)

    def teacher(self, replies: list[Reply]) -> Ensemble:
        """The ensemble of the uploaded models (eval mode, frozen)."""
        models = [self.parts.assemble(self.parts.new(), r.message.arrays, {}) for r in replies]
        ensemble = Ensemble(models).to(self.device).eval()
        ensemble.requires_grad_(False)
        return ensemble

    def generator_step(self, teacher: nn.Module, student: nn.Module, x: Tensor, targets: Tensor,
                       stats: BNStatistics) -> dict[str, Tensor]:
        """The generator's loss terms on the view x (module doc) and their weighted sum `total`."""
        p = self.params
        t_out = teacher(x)
        terms = {"oh": F.cross_entropy(t_out, targets), "bn": stats.loss(),
                 "adv": adversarial_loss(student(x), t_out)}
        terms["total"] = p.oh * terms["oh"] + p.bn * terms["bn"] + p.adv * terms["adv"]
        return terms

    def synthesize(self, teacher: nn.Module, student: nn.Module, generator: Generator, geometry: tuple[int, ...],
                   g: torch.Generator) -> tuple[Tensor, dict[str, float]]:
        """One epoch's data generation: the lowest-loss batch of `g_steps` (images in [0, 1]) and the mean terms."""
        p, fmt = self.params, self.params.image_format()
        if p.reset_generator:
            generator.reset(g)
        z = torch.randn(p.synthesis_batch_size, p.nz, generator=g).to(self.device).requires_grad_(True)
        targets = torch.randint(0, self.num_classes, (p.synthesis_batch_size,), generator=g).sort().values
        opt = torch.optim.Adam([*generator.parameters(), z], lr=p.lr_g, betas=(0.5, 0.999))
        stats, best, best_cost, sums = BNStatistics(teacher), None, float("inf"), dict[str, float]()
        student.requires_grad_(False)
        try:
            for _ in range(p.g_steps):
                images = generator(z)
                view = augment(images, g) if p.augment else images
                terms = self.generator_step(teacher, student, fmt.to_classifier(view, *geometry),
                                            targets.to(self.device), stats)
                if float(terms["total"].detach()) < best_cost:  # (NaN never is; `descend` then stops)
                    best_cost, best = float(terms["total"].detach()), images.detach().clone()
                descend(opt, terms["total"], "DENSE's generator training", "lower method_args.lr_g")
                sums = {k: sums.get(k, 0.0) + float(v.detach()) / p.g_steps for k, v in terms.items()}
        finally:
            stats.remove()
            student.requires_grad_(True)
        assert best is not None
        return best, sums

    def distill(self, student: nn.Module, teacher: nn.Module, pool: Tensor, opt: torch.optim.Optimizer,
                geometry: tuple[int, ...]) -> float:
        """One pass of KL(D ‖ f_S) · T² over the shuffled pool; the mean loss."""
        p, fmt = self.params, self.params.image_format()
        student.train()
        total, steps = 0.0, 0
        for idx in torch.split(torch.randperm(len(pool)), p.kd_batch_size):
            if len(idx) < 2:  # BatchNorm
                continue
            x = fmt.to_classifier(pool[idx], *geometry)
            with torch.no_grad():
                t_out = teacher(x)
            loss = kd_loss(student(x), t_out, p.temperature)
            descend(opt, loss, "DENSE's distillation", "lower method_args.kd_lr")
            total, steps = total + float(loss.detach()), steps + 1
        return total / max(steps, 1)

    def aggregate(self, server: DenseServer, replies: list[Reply], info: RoundInfo) -> DenseServer:
        """The teacher from the uploads, then `server_epochs` of data generation and distillation."""
        if not replies:
            return server
        p = self.params
        shapes = {tuple(int(r.message.scalars[k]) for k in GEOMETRY) for r in replies}
        if len(shapes) > 1:
            raise ConfigError(f"dense clients sent inputs of different shapes {sorted(shapes)}; set data.image_size")
        geometry = shapes.pop()
        teacher = self.teacher(replies)
        student = self.server_model(server).to(self.device)
        generator = Generator(p.nz, p.ngf, max(geometry[1:]), geometry[0]).to(self.device).train()
        opt = torch.optim.SGD(student.parameters(), lr=p.kd_lr, momentum=0.9)
        g = torch_generator(info.seed, "dense-server")
        pool: list[Tensor] = []
        losses: dict[str, float] = {}
        for epoch in range(p.server_epochs):
            student.train()
            batch, losses = self.synthesize(teacher, student, generator, geometry, g)
            pool.append(batch)
            losses["kd"] = self.distill(student, teacher, torch.cat(pool), opt, geometry)
            log.info("dense: epoch %d, generator %s", epoch + 1, {k: round(v, 4) for k, v in losses.items()})
        return dataclasses.replace(server, model=state_of(student, self.parts.shared),
                                   synthetic=sum(len(b) for b in pool), losses=losses)
