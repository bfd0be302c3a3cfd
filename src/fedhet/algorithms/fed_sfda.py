"""Fed-SFDA (AdaptFED / TransFed Sec. 3.4, spec 2.7; the recipe of LADD, Shenaj et al. WACV 2023): federated
source-free domain adaptation. The server holds labelled source data D_S; the clients hold unlabelled target data.

Round 1, the style wave: the server sends no model, only the FDA band half-width b (`fda_band`); each client
sends its style s_k (the mean low-frequency amplitude window of its images, C x (2b+1) x (2b+1),
`fedhet.data.fda`) and nothing else. The server loads D_S (`method_args.source`, a data section read through the
data registry: the clients never send images or labels), adds one FDA-stylised copy of D_S (each image gets a
random client's style, phase kept), pre-trains the model on both and drops D_S.
Rounds 2..R, unsupervised adaptation: each client trains the received global student on
    L = L_PSEUDO + lambda_KD * L_KD        (pseudo-labels and KD targets from its own SWA teacher g_c)
and keeps g_c: w_g(t+omega) = (w_g(t) n_t + w_c(t+omega)) / (n_t + 1), n_t = (t - t_START) / omega, from round
t_START on every omega rounds (before t_START, g_c is the first global model it received, i.e. the source model).
The server FedAvg-s the students (sample-weighted under server.aggregation=weighted). Labels of the clients'
data are never read in training; they are used for evaluation only.

Choices the paper leaves open (spec 2.10; defaults and reasons: docs/fed_sfda.md): `kd_teacher` "swa" (L_KD to
the SWA teacher) | "source" (LADD's code: to the frozen pre-trained model), `deploy` "global" (the FedAvg student)
| "teacher" (the client's SWA teacher), `bn_stats` "target" (BatchNorm trains as usual) | "source" (eval mode
during adaptation: the source model's statistics).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from fedhet.algorithms.base import Algorithm, ArraySpec, Capabilities
from fedhet.algorithms.fed_sfda_parts import (
    kd_loss,
    keep_batchnorm_statistics,
    load_source,
    pseudo_label_loss,
    stylise,
    swa_update,
)
from fedhet.algorithms.registry import register
from fedhet.algorithms.server_training import train_on_tensors
from fedhet.config import DataConfig
from fedhet.core.contract import (
    ClientContext,
    ClientState,
    Deployment,
    FitStats,
    LocalPass,
    Optimizers,
    OptimSpec,
    RoundInfo,
    ServerState,
    Work,
)
from fedhet.core.messages import Message, Reply, Scalar
from fedhet.core.params import StateDict, load_partial, state_of
from fedhet.core.protocols import num_samples
from fedhet.data.fda import fda_band, low_band
from fedhet.data.registry import resolve_spec
from fedhet.errors import ConfigError
from fedhet.models import SplitModel

log = logging.getLogger(__name__)

__all__ = ["BAND", "STYLE", "FedSFDA", "FedSFDAParams", "FedSFDAServer", "FedSFDAState", "FedSFDAWork"]

BAND, STYLE = "fda_band", "style"  # the style wave's broadcast scalar and reply array
TEACHERS, DEPLOYS, BN_STATS = ("swa", "source"), ("global", "teacher"), ("target", "source")


@dataclass
class FedSFDAParams:
    """`source`: the server's labelled data (a `data` section; its domains are D_S, e.g. three PACS domains).
    FDA: `beta`, `fda` (False: pre-train on D_S alone, the no-style ablation). Pre-training: `pretrain_epochs`,
    `pretrain_lr` (None: train.lr). Adaptation: `threshold`, `temperature`, `lambda_kd`, `omega`, `t_start`,
    `kd_teacher`, `deploy`, `bn_stats` (module docstring; docs/fed_sfda.md)."""

    source: DataConfig = field(default_factory=DataConfig)
    beta: float = 0.05
    fda: bool = True
    pretrain_epochs: int = 1
    pretrain_lr: float | None = None
    threshold: float = 0.9
    temperature: float = 2.0
    lambda_kd: float = 1.0
    omega: int = 1
    t_start: int = 2
    kd_teacher: str = "swa"
    deploy: str = "global"
    bn_stats: str = "target"

    def validate(self) -> None:
        self.source.validate()
        fda_band(32, 32, self.beta)  # the range check
        checks = [(self.pretrain_epochs >= 0, f"pretrain_epochs must be >= 0, got {self.pretrain_epochs}"),
                  (self.pretrain_lr is None or self.pretrain_lr > 0, "pretrain_lr must be > 0"),
                  (0.0 <= self.threshold <= 1.0, f"threshold must be in [0, 1], got {self.threshold}"),
                  (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
                  (self.lambda_kd >= 0, f"lambda_kd must be >= 0, got {self.lambda_kd}"),
                  (self.omega >= 1 and self.t_start >= 2, "need omega >= 1 and t_start >= 2 (round 1 is the "
                                                          f"style wave), got {self.omega}, {self.t_start}"),
                  (self.kd_teacher in TEACHERS, f"kd_teacher must be one of {TEACHERS}, got '{self.kd_teacher}'"),
                  (self.deploy in DEPLOYS, f"deploy must be one of {DEPLOYS}, got '{self.deploy}'"),
                  (self.bn_stats in BN_STATS, f"bn_stats must be one of {BN_STATS}, got '{self.bn_stats}'")]
        for ok, why in checks:
            if not ok:
                raise ConfigError(f"fed_sfda method_args: {why}")


@dataclass(kw_only=True)
class FedSFDAServer(ServerState):
    """`pretrained`: the style wave is done and `model` is the source model (then the FedAvg student);
    `styles`: the clients' styles it used (K x C x w x w)."""

    pretrained: bool = False
    styles: Tensor | None = None


@dataclass(kw_only=True)
class FedSFDAState(ClientState):
    """The client's SWA teacher, how many models it averages, and (kd_teacher=source) the source model."""

    teacher: StateDict | None = None
    swa_n: int = 0
    source: StateDict | None = None


@dataclass(kw_only=True)
class FedSFDAWork(Work):
    """A fit: the style wave's band and running sum, or the adaptation's teacher and KD models and the count of
    confident pseudo-labels."""

    band: int | None = None
    style_sum: Tensor | None = None
    images: int = 0
    size: tuple[int, int] = (0, 0)
    teacher: nn.Module | None = None
    kd: nn.Module | None = None
    kept: float = 0.0
    seen: int = 0


@register
class FedSFDA(Algorithm[FedSFDAServer, FedSFDAState, FedSFDAWork, FedSFDAParams]):
    """Style wave, server pre-training on D_S + FDA(D_S), then SWA-teacher self-training with KD, FedAvg."""

    name = "fed_sfda"
    shared_aggregation = True  # its students' FedAvg is the shared aggregation (robust rules apply)
    Params = FedSFDAParams
    # L_KD's weight, the pseudo-label threshold and the KD temperature: read in `adapt_step` only
    capabilities = Capabilities(call_params=frozenset({"lambda_kd", "threshold", "temperature"}))
    server_state_type, client_state_type, work_type = FedSFDAServer, FedSFDAState, FedSFDAWork

    # ------------------------------------------------------------------ server side
    def band(self) -> tuple[int, int]:
        """(channels, FDA half-width b) of the source images."""
        spec = resolve_spec(self.params.source)
        size = self.params.source.image_size or spec.default_image_size
        if spec.modality != "image" or not size:
            raise ConfigError(f"fed_sfda needs an image dataset as method_args.source, got '{spec.name}'")
        return spec.channels, fda_band(int(size), int(size), self.params.beta)

    def broadcast(self, server: FedSFDAServer, info: RoundInfo, client_id: int) -> Message:
        """The style wave (no model, the band b only) until the server has pre-trained; then the global model."""
        if not server.pretrained:
            return Message(scalars={BAND: self.band()[1]})
        return Message(arrays=server.model)

    def reply_layout(self, broadcast: Message) -> dict[str, ArraySpec]:
        if BAND in broadcast.scalars:
            b = int(broadcast.scalars[BAND])
            return {STYLE: ((self.band()[0], 2 * b + 1, 2 * b + 1), torch.float32)}
        return super().reply_layout(broadcast)

    def aggregate(self, server: FedSFDAServer, replies: list[Reply], info: RoundInfo) -> FedSFDAServer:
        """After the style wave: pre-train on D_S and its stylised copy; after that, FedAvg of the students."""
        if server.pretrained:
            return super().aggregate(server, replies, info)
        p, (_, b) = self.params, self.band()
        source = load_source(p.source, info.seed, self.num_classes)
        styles = torch.stack([r.message.arrays[STYLE] for r in replies]) if replies else None
        for r in replies:
            size = (int(r.message.scalars["height"]), int(r.message.scalars["width"]))
            if size != tuple(source.x.shape[-2:]):
                raise ConfigError(f"client {r.client_id}'s images are {size[0]} x {size[1]}, the source's "
                                  f"{source.x.shape[-2]} x {source.x.shape[-1]}; set method_args.source.image_size "
                                  "to data.image_size")
        if p.fda and styles is not None:
            source = dataclasses.replace(source, x=torch.cat([source.x, stylise(source.x, styles, b)]),
                                         y=torch.cat([source.y, source.y]))
        elif p.fda:
            log.warning("fed_sfda: no client sent a style in round 1; pre-training on the source data alone")
        model = self.server_model(server)
        loss = train_on_tensors(model, source.x, source.y, p.pretrain_epochs, self.train_cfg,
                                p.pretrain_lr or self.train_cfg.lr, self.device, hflip=source.hflip,
                                what="Fed-SFDA source pre-training", lr_setting="method_args.pretrain_lr")
        log.info("fed_sfda: pre-trained on %d source images (%s), last epoch loss %.4f", len(source.y),
                 "with FDA styles" if p.fda and styles is not None else "no styles", loss)
        return dataclasses.replace(server, model=state_of(model, self.parts.shared), pretrained=True, styles=styles)

    # ------------------------------------------------------------------ client side
    def start(self, msg: Message, state: FedSFDAState, ctx: ClientContext) -> FedSFDAWork:
        """The style wave's accumulator, or the student (received model), the SWA teacher and the KD model."""
        if BAND in msg.scalars:
            return FedSFDAWork(msg=msg, ctx=ctx, model=self.parts.spare("workspace"), band=int(msg.scalars[BAND]))
        teacher = self.kept_model(msg, state, "teacher", state.teacher)
        kd = self.kept_model(msg, state, "source", state.source) if self.params.kd_teacher == "source" else teacher
        return FedSFDAWork(msg=msg, ctx=ctx, model=self.client_model(msg, state), teacher=teacher.eval(),
                           kd=kd.eval())

    def passes(self, work: FedSFDAWork) -> list[LocalPass]:
        """The style pass over the client's images (one epoch, no optimizer), or the adaptation pass."""
        if work.band is not None:
            data = work.ctx.data.train_eval
            n = num_samples(data)
            bs = self.train_cfg.batch_size + (1 if n % self.train_cfg.batch_size == 1 else 0)  # no lone last image
            train = dataclasses.replace(self.train_cfg, local_epochs=1, local_steps=None, batch_size=bs)
            return [LocalPass("style", lambda x, y, opt: self.style_step(work, x), {}, train, data=data)]
        optims = {"model": OptimSpec.from_train(list(work.model.parameters()), self.train_cfg)}
        return [LocalPass("adapt", lambda x, y, opt: self.adapt_step(work, x, opt), optims, self.train_cfg,
                          modules=(work.model,))]

    def style_step(self, work: FedSFDAWork, x: Tensor) -> Tensor:
        """Add the batch's low bands to the client's running sum (its style is their mean)."""
        assert work.band is not None
        band = low_band(x, work.band).sum(dim=0)
        work.style_sum = band if work.style_sum is None else work.style_sum + band
        work.images, work.size = work.images + len(x), (int(x.shape[-2]), int(x.shape[-1]))
        return torch.zeros((), device=x.device)

    def adapt_step(self, work: FedSFDAWork, x: Tensor, optimizers: Optimizers) -> Tensor:
        """One SGD step on L_PSEUDO + lambda_KD * L_KD; the labels of the batch are never read."""
        assert work.teacher is not None and work.kd is not None
        p = self.params
        if p.bn_stats == "source":
            keep_batchnorm_statistics(work.model)
        student: Tensor = work.model(x)  # nn.Module calls are untyped in torch
        with torch.no_grad():
            teacher = work.teacher(x)
            kd_target = teacher if work.kd is work.teacher else work.kd(x)
        pseudo, mask = pseudo_label_loss(student, teacher, p.threshold)
        loss = pseudo + p.lambda_kd * kd_loss(student, kd_target, p.temperature)
        optimizers.step(loss, "model")
        work.kept, work.seen = work.kept + float(mask.sum()), work.seen + len(x)
        return loss

    def finish(self, work: FedSFDAWork, state: FedSFDAState, stats: FitStats) -> tuple[Message, FedSFDAState]:
        """Style wave: send the style only. Adaptation: send the student; update the SWA teacher (Sec. 3.4)."""
        if work.band is not None:
            if work.style_sum is None:
                raise ConfigError(f"client {work.ctx.client_id} has no images to extract an FDA style from")
            scalars: dict[str, Scalar] = {"height": work.size[0], "width": work.size[1], "images": work.images}
            return Message(arrays={STYLE: (work.style_sum / work.images).float().cpu()}, scalars=scalars), state
        assert work.teacher is not None
        p, t = self.params, work.ctx.round
        teacher, n = state_of(work.teacher), state.swa_n
        if t >= p.t_start and (t - p.t_start) % p.omega == 0:
            teacher, n = swa_update(teacher, state_of(work.model), n), n + 1
        source = state.source
        if p.kd_teacher == "source" and source is None:
            source = {k: v.clone() for k, v in work.msg.arrays.items()}
        reply, new = super().finish(work, state, stats)
        reply.scalars["pseudo_kept"] = work.kept / max(work.seen, 1)
        return reply, dataclasses.replace(new, teacher=teacher, swa_n=n, source=source)

    def deploy(self, msg: Message, state: FedSFDAState, ctx: ClientContext) -> Deployment:
        """The global student, or (deploy=teacher) the client's SWA teacher once it has one."""
        kept = state.teacher if self.params.deploy == "teacher" else None
        return Deployment(self.kept_model(msg, state, "workspace", kept))

    def kept_model(self, msg: Message, state: FedSFDAState, slot: str, kept: StateDict | None) -> SplitModel:
        """The received model (+ local part) in `slot`, overwritten by the weights the client `kept` (its SWA
        teacher or source model) once it has them."""
        model = self.client_model(msg, state, slot)
        if kept is not None:
            load_partial(model, kept)
        return model
