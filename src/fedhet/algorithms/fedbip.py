"""FedBiP (Chen et al., CVPR 2025; spec fedbip.md; docs/fedbip.md): one-shot FL with a personalized, frozen
latent diffusion model. One round (`one_shot`): every client uploads once, the server generates and trains.

Client (Alg. 1 ClientUpdate; `start` / one pass / `finish`): its training images (eval transform, mapped back to
[0, 1] RGB at the LDM's size) are VAE-encoded; instance level (Eq. 3): each latent is interpolated with a random
same-class partner (γ ~ N(0.5, 0.1²) clipped to [0, 1]) and noised to the maximum timestep T; concept level
(Eq. 4): the domain vectors S and class vectors V are learned on the real latents with the frozen LDM (the pass
"concepts": Adam, lr 0.1). The reply is exactly {z_i(T), y_i}, S and V (`FedBiPUpload`) plus the images'
geometry (channels, height, width: metadata the server needs to shape D_syn for the classifier).
Server (Alg. 1 ServerUpdate, Eqs. 5-6; `aggregate`): for every client, `multiplier` x N images (FedBiP-S / M / L:
2 / 5 / 10), image j from uploaded latent j mod N with its own η of Ŝ = S + σ η, PNDM-denoised with
τ_θ(Ŝ, V_y) and decoded (resumable, `fedbip_parts.synthesize`); then the run's model is trained on D_syn only
and deployed to every client (evaluated on each client's real test split).

Table 3 (`personalize`, a subset of zT, S, V): without S (or V) the slot holds the word's own vectors (the
domain's name, or `domain_words`; the class name) and is not learned; without zT generation starts from fresh
Gaussian noise (the upload is unchanged, so every row sees the same labels). Where the paper is silent: docs/fedbip.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fedhet.algorithms.base import Algorithm, ArraySpec, Capabilities
from fedhet.algorithms.fedbip_params import FedBiPParams, client_settings
from fedhet.algorithms.fedbip_parts import SynthesisPlan, TimedGeneration, synthesize, upload_key
from fedhet.algorithms.registry import register
from fedhet.algorithms.server_training import train_on_tensors
from fedhet.atomic import atomic_torch_save
from fedhet.cache import cache_root
from fedhet.core.contract import (
    ClientContext,
    ClientState,
    FitStats,
    LocalPass,
    Optimizers,
    OptimSpec,
    RoundInfo,
    ServerState,
    Work,
)
from fedhet.core.messages import Message, Reply, Scalar
from fedhet.core.params import state_of
from fedhet.errors import ConfigError, FedhetError
from fedhet.models.ldm.checkpoint import load_components, resolve_checkpoint
from fedhet.models.ldm.client import FedBiPUpload, instance_latents, max_noise_std
from fedhet.models.ldm.concepts import Concepts, check_frozen, concept_loss, init_concepts
from fedhet.models.ldm.prompts import PromptEncoder

log = logging.getLogger(__name__)
GEOMETRY = ("channels", "height", "width")  # reply scalars: the shape of the client's classifier inputs


@dataclass(kw_only=True)
class FedBiPServer(ServerState):
    """`model`: the classifier trained on D_syn (once the round is over); `synthetic`: |D_syn|; `sets`: client
    id -> the cache key of its generated images (their folder under the cache, e.g. for sample grids); `cost`:
    seconds per client upload (mean), per generated image and for the classifier, and the images generated
    (not read from the cache)."""

    synthetic: int = 0
    sets: dict[int, str] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)

    def facts(self) -> dict[str, Any]:  # Any: JSON facts
        """|D_syn| and the cost, for summary.json."""
        return {"fedbip": {"synthetic": self.synthetic, "cost": dict(self.cost)}} if self.synthetic else {}


@dataclass(kw_only=True)
class FedBiPWork(Work):
    """A client's one fit: real latents z(0) and labels (the concept pass's data), the noised interpolated
    latents z(T), S and V (learned or fixed), and the classifier's input geometry."""

    real: Tensor
    labels: Tensor
    noised: Tensor
    concepts: nn.ParameterDict
    geometry: tuple[int, int, int]
    upload_file: Path | None = None
    cached: dict[str, Any] | None = None  # Any: torch.load of the cache file
    began: float = 0.0


def load_split(data: Dataset[Any]) -> tuple[Tensor, Tensor]:  # Any: samples: (x, y)
    """All (x, y) of a split, stacked (eval transform: no augmentation)."""
    xs, ys = [], []
    for x, y in DataLoader(data, batch_size=512, shuffle=False):
        xs.append(x)
        ys.append(torch.as_tensor(y).long())
    if not xs:
        raise ConfigError("a fedbip client has no training images to upload")
    return torch.cat(xs), torch.cat(ys)


@register
class FedBiP(Algorithm[FedBiPServer, ClientState, FedBiPWork, FedBiPParams]):
    """One upload per client (z(T), y, S, V); the server generates D_syn with the frozen LDM and trains on it."""

    name = "fedbip"
    Params = FedBiPParams
    one_shot = True
    capabilities = Capabilities(modality="latent-diffusion")
    server_state_type, client_state_type, work_type = FedBiPServer, ClientState, FedBiPWork

    # ------------------------------------------------------------------ the frozen LDM
    def encoder(self) -> PromptEncoder:
        """τ_θ with the template's slots, on the frozen LDM (loaded once per process)."""
        cached: PromptEncoder | None = self.__dict__.get("_encoder")
        if cached is None:
            p = self.params
            try:
                parts = load_components(p.ldm, self.device)
            except FedhetError as err:
                raise ConfigError(f"fedbip method_args.ldm '{p.ldm}': {err}") from err
            try:  # the template's slots as this LDM's tokenizer splits them
                cached = PromptEncoder(parts, p.template, p.n_domain, p.n_class, p.mode)
            except FedhetError as err:
                raise ConfigError(f"fedbip method_args.template '{p.template}' with the LDM '{p.ldm}': {err}") from err
            check_frozen(cached)
            self.__dict__["_encoder"] = cached
        return cached

    def image_side(self) -> int:
        """The LDM's image side (the VAE's sample size)."""
        return int(self.encoder().parts.vae.config.sample_size)

    def ldm_identity(self) -> tuple[str, ...]:
        """The checkpoint folder's files, sizes and modification times (part of the generation cache key)."""
        root = resolve_checkpoint(self.params.ldm)
        return tuple(f"{f.relative_to(root)}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
                     for f in sorted(root.rglob("*")) if f.is_file())

    # ------------------------------------------------------------------ client side
    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> FedBiPWork:
        """Encode the client's images; z(T) (Eq. 3 + δ(T, ·)); S and V to start the concept pass from."""
        began = time.perf_counter()
        p, enc = self.params, self.encoder()
        x, y = load_split(ctx.data.train_eval)
        images = p.image_format().to_ldm(x, self.image_side())
        seed = int(torch.randint(0, 2**62, (1,)))  # from the engine's seeded RNG
        g = torch.Generator().manual_seed(seed)
        real, noised = instance_latents(enc.parts, images, y, g, p.singleton, p.posterior, start=p.start_latent)
        concepts = self.initial_concepts(enc, ctx, g)
        geometry = (int(x.shape[1]), int(x.shape[2]), int(x.shape[3]))
        work = FedBiPWork(msg=msg, ctx=ctx, model=self.parts.spare("workspace"), real=real.cpu(), labels=y,
                          noised=noised.cpu(), concepts=concepts, geometry=geometry, began=began)
        folder = self.cache_folder()
        if folder is not None:  # a simulation's repeat of this exact client computation reads its upload
            key = upload_key(FedBiPUpload(noised.cpu(), y, concepts["domain"].detach(), concepts["classes"].detach()),
                             seed, self.ldm_identity(), client_settings(p), ctx.data.domain, ctx.class_names)
            work.upload_file = folder / "uploads" / f"{key}.pt"
            if work.upload_file.is_file():
                work.cached = torch.load(work.upload_file, weights_only=True)
        return work

    def initial_concepts(self, enc: PromptEncoder, ctx: ClientContext, g: torch.Generator) -> nn.ParameterDict:
        """S and V: learned ones from `init`, the others from their words (and frozen)."""
        p = self.params
        names = p.class_words or list(ctx.class_names)
        if len(names) != self.num_classes:
            raise ConfigError(f"fedbip needs {self.num_classes} class names for its prompts, got {len(names)}; set "
                              "method_args.class_words")
        domain_word = p.domain_words.get(ctx.data.domain, ctx.data.domain)
        learned = init_concepts(enc, self.num_classes, g, p.init, domain_word, names)
        words = learned if p.init == "words" else init_concepts(enc, self.num_classes, g, "words", domain_word,
                                                                names)
        pick = {"domain": ("S", learned.domain, words.domain), "classes": ("V", learned.classes, words.classes)}
        return nn.ParameterDict({key: nn.Parameter((own if c in p.personalize else word).clone(),
                                                   requires_grad=c in p.personalize)
                                 for key, (c, own, word) in pick.items()})

    def passes(self, work: FedBiPWork) -> list[LocalPass]:
        """Concept learning (Eq. 4) over the real latents, when S or V is personalized."""
        p = self.params
        trained = [t for t in work.concepts.values() if t.requires_grad]
        if not trained or p.concept_epochs == 0 or work.cached is not None:
            return []
        train = dataclasses.replace(self.train_cfg, batch_size=p.concept_batch_size, local_epochs=p.concept_epochs,
                                    local_steps=None)
        optim = OptimSpec(params=trained, kind="adam", lr=p.concept_lr, betas=(0.9, 0.999))
        return [LocalPass("concepts", lambda z, y, opt: self.concept_step(work, z, y, opt), {"concepts": optim},
                          train, data=TensorDataset(work.real, work.labels))]

    def concept_step(self, work: FedBiPWork, z0: Tensor, y: Tensor, optimizers: Optimizers) -> Tensor:
        """One Adam step on Eq. (4): t ~ U{0..T-1}, ϵ ~ N(0, I) (torch's global RNG, seeded by the engine)."""
        enc = self.encoder()
        t = torch.randint(0, enc.parts.num_train_timesteps, (len(y),))
        eps = torch.randn(z0.shape)
        loss = concept_loss(enc, Concepts(work.concepts["domain"], work.concepts["classes"]), z0, y, t, eps)
        optimizers.step(loss, "concepts")
        return loss

    def finish(self, work: FedBiPWork, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        """The one upload: {z(T), y}, S, V. Its only scalars are metadata: the classifier input geometry, the
        concept steps and the client's seconds (the cost table); no loss or other statistic of the images. The
        client keeps nothing."""
        if work.cached is not None:
            return Message(arrays=work.cached["arrays"], scalars=dict(work.cached["scalars"])), state
        upload = FedBiPUpload(work.noised.float(), work.labels.long(), work.concepts["domain"].detach().float(),
                              work.concepts["classes"].detach().float())
        scalars: dict[str, Scalar] = {"steps": stats.steps, "seconds": time.perf_counter() - work.began}
        scalars.update(zip(GEOMETRY, work.geometry, strict=True))
        if work.upload_file is not None:
            atomic_torch_save({"arrays": upload.tensors(), "scalars": scalars}, work.upload_file)
        return Message(arrays=upload.tensors(), scalars=scalars), state

    def reply_layout(self, broadcast: Message) -> dict[str, ArraySpec]:
        """z(T) (-1, c, h, w), y (-1,), S (n_s, d), V (C, n_v, d): -1 is the client's number of images."""
        enc = self.encoder()
        parts, side = enc.parts, self.image_side() // enc.parts.vae_factor
        n_s, n_v = len(enc.layout.domain_positions), len(enc.layout.class_positions)
        return {"latents": ((-1, parts.latent_channels, side, side), torch.float32), "labels": ((-1,), torch.int64),
                "domain": ((n_s, enc.vector_dim), torch.float32),
                "classes": ((self.num_classes, n_v, enc.vector_dim), torch.float32)}

    # ------------------------------------------------------------------ server side
    def broadcast(self, server: FedBiPServer, info: RoundInfo, client_id: int) -> Message:
        """Before the server step, nothing but the request (the LDM is public and the client trains no model);
        after it, the classifier, which every client deploys (evaluation, `fedhet privacy`). One round only:
        build_experiment refuses rounds != 1 (`one_shot`)."""
        if not server.synthetic:
            return Message(scalars={"one_shot": True})
        return Message(arrays=server.model)

    def cache_folder(self) -> Path | None:
        """Where generated parts and client uploads are kept (None: not kept)."""
        p = self.params
        if not p.cache:
            return None
        return Path(p.cache_dir) if p.cache_dir else cache_root() / "fedbip"

    def synthetic_set(self, reply: Reply, seed: int, run: TimedGeneration
                      ) -> tuple[Tensor, Tensor, tuple[int, int, int], str]:
        """One client's part of D_syn: (images uint8 (M, 3, s, s), labels (M,), the classifier input geometry,
        its cache key)."""
        p, arrays = self.params, reply.message.arrays
        try:
            upload = FedBiPUpload(arrays["latents"], arrays["labels"], arrays["domain"], arrays["classes"])
            c, h, w = (int(reply.message.scalars[k]) for k in GEOMETRY)
        except (KeyError, FedhetError) as err:
            raise ConfigError(f"client {reply.client_id}'s fedbip upload is malformed: {err}") from err
        redraw = max_noise_std(self.encoder().parts.train_scheduler) if p.start_latent == "fresh" else 0.0
        plan = SynthesisPlan(p.multiplier, p.chunk, "zT" in p.personalize, seed, reply.client_id, redraw)
        gen = p.generation()
        key = upload_key(upload, self.ldm_identity(), p.template, p.n_domain, p.n_class, p.mode, gen,
                         plan.key_fields())
        images, labels = synthesize(upload, plan, gen, run, self.cache_folder(), key)
        log.info("fedbip: client %d, %d synthetic images from %d uploaded latents", reply.client_id, len(labels),
                 len(upload.labels))
        return images, labels, (c, h, w), key

    def aggregate(self, server: FedBiPServer, replies: list[Reply], info: RoundInfo) -> FedBiPServer:
        """D_syn from every upload (Eq. 5 x multiplier), then the classifier on D_syn only (Eq. 6)."""
        if not replies:
            return server
        xs, ys, shapes, sets, timed = [], [], set(), {}, TimedGeneration(self.encoder())
        for reply in sorted(replies, key=lambda r: r.client_id):
            images, labels, (c, h, w), sets[reply.client_id] = self.synthetic_set(reply, info.seed, timed)
            xs.append(self.params.image_format().to_classifier(images.float() / 255, c, h, w))
            ys.append(labels)
            shapes.add((c, h, w))
        if len(shapes) > 1:
            raise ConfigError(f"fedbip clients sent images of different shapes {sorted(shapes)}: one classifier "
                              "needs one input size; set data.image_size")
        model = self.server_model(server)
        x, y = torch.cat(xs), torch.cat(ys)
        start = time.perf_counter()
        loss = train_on_tensors(model, x, y, self.params.classifier_epochs, self.train_cfg, self.train_cfg.lr,
                                self.device, what="FedBiP classifier training on the synthetic data")
        log.info("fedbip: classifier trained on %d synthetic images, last epoch loss %.4f", len(y), loss)
        cost = {"client_seconds": sum(float(r.message.scalars.get("seconds", 0.0)) for r in replies) / len(replies),
                "generated_images": float(timed.images), "seconds_per_image": timed.seconds / max(timed.images, 1),
                "classifier_seconds": time.perf_counter() - start}
        return dataclasses.replace(server, model=state_of(model, self.parts.shared), synthetic=len(y), sets=sets,
                                   cost=cost)
