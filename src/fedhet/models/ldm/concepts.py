"""FedBiP concept-level personalization: learn S and V with the frozen LDM (§4.2.2, Eq. 4; spec §2.2 (b)).

S ∈ ℝ^{n_s×d} (the client's domain) and V ∈ ℝ^{C×n_v×d} (one per class) are the only trainable tensors; they
minimise Eq. (4)

    L_g = E_{z(0), y, ϵ ~ N(0, I), t ~ U{1..T}} ‖ϵ − ϵ_θ(z(t), t, τ_θ(S, V_y))‖²,   z(t) = √ᾱ_t z(0) + √(1−ᾱ_t) ϵ

on the client's *real* (non-interpolated) latents z(0) = ℰ(x), with the DDPM schedule's add_noise (diffusers'
t ∈ {0..T-1} is the paper's {1..T}). Optimiser (App. A): Adam, lr 0.1, betas (0.9, 0.999); 30 epochs (App. A;
§5.1 and the official train.sh say 50: `epochs`). Not stated in the paper, chosen here: batch size 8 (train.sh's),
no weight decay; the posterior sample of ℰ is not redrawn per epoch (the caller encodes once; the official code
redraws per batch: equal in expectation). A v-prediction UNet is trained against its velocity target (as
diffusers' scripts do).

Initialisation (`init`): "random" (the paper: "randomly initialize") draws N(0, s²) with s the standard deviation
of the vectors the slot would otherwise hold (the input embedding table for "token", the encoded prompt's states
for "output"), so the start has the scale τ_θ expects; "words" (the official code) starts from the real names:
the name's token embeddings ("token") or τ_θ's output states at the name's positions in the template filled with
the real names ("output"). A name of m tokens fills n slots with its first n tokens, the last repeated if m < n.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedhet.errors import FedhetError
from fedhet.losses.descent import descend
from fedhet.models.ldm.prompts import PromptEncoder, layout_of

INITS = ("random", "words")


@dataclass
class Concepts:
    """S (n_s, d) and V (C, n_v, d)."""

    domain: torch.Tensor
    classes: torch.Tensor

    def detach(self) -> Concepts:
        """A detached copy (what is uploaded)."""
        return Concepts(self.domain.detach().clone(), self.classes.detach().clone())


@dataclass
class ConceptConfig:
    """Eq. (4) optimisation: Adam(lr, betas), `epochs` over the client's latents in batches of `batch_size`."""

    epochs: int = 30
    batch_size: int = 8
    lr: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0


def init_concepts(encoder: PromptEncoder, num_classes: int, generator: torch.Generator, init: str = "random",
                  domain_name: str | None = None, class_names: Sequence[str] | None = None) -> Concepts:
    """Initial S (n_s, d) and V (num_classes, n_v, d), float32 on CPU (see the module doc for `init`)."""
    n_s, n_v = len(encoder.layout.domain_positions), len(encoder.layout.class_positions)
    if init == "random":
        scale = _reference_std(encoder)
        domain = torch.randn(n_s, encoder.vector_dim, generator=generator) * scale
        return Concepts(domain, torch.randn(num_classes, n_v, encoder.vector_dim, generator=generator) * scale)
    if init != "words":
        raise FedhetError(f"unknown concept init '{init}'; valid: {', '.join(INITS)}")
    if domain_name is None or class_names is None or len(class_names) != num_classes:
        raise FedhetError(f"init 'words' needs domain_name and {num_classes} class_names, got {domain_name!r} and "
                          f"{None if class_names is None else len(class_names)} names")
    rows = [_name_vectors(encoder, domain_name, class_names[0], "domain", n_s)]
    rows += [_name_vectors(encoder, domain_name, name, "class", n_v) for name in class_names]
    return Concepts(rows[0], torch.stack(rows[1:]))


@torch.no_grad()
def _reference_std(encoder: PromptEncoder) -> float:
    """The std of what a slot holds without injection: embedding table ("token") or encoded states ("output")."""
    if encoder.mode == "token":
        return float(encoder.parts.text_encoder.get_input_embeddings().weight.float().std())
    lay = encoder.layout
    return float(encoder.run(lay.input_ids[None], lay.attention_mask[None]).float().std())


@torch.no_grad()
def _name_vectors(encoder: PromptEncoder, domain: str, name: str, slot: str, n: int) -> torch.Tensor:
    """(n, d): the vectors of the real word `name` at `slot` ("words" init), first n tokens, last repeated."""
    parts = encoder.parts
    lay = layout_of(encoder.template, parts.tokenizer, domain, name, parts.max_length, encoder.pad_to)
    positions = lay.domain_positions if slot == "domain" else lay.class_positions
    if encoder.mode == "token":
        vectors = parts.text_encoder.get_input_embeddings()(lay.input_ids[positions].to(parts.device))
    else:
        vectors = encoder.run(lay.input_ids[None], lay.attention_mask[None])[0, positions.to(parts.device)]
    index = torch.tensor([min(j, len(positions) - 1) for j in range(n)])
    out: torch.Tensor = vectors.float().cpu()[index].clone()  # the text encoder (transformers) is untyped
    return out


def concept_loss(encoder: PromptEncoder, concepts: Concepts, latents: torch.Tensor, labels: torch.Tensor,
                 timesteps: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Eq. (4) on one batch: mean ‖target − ϵ_θ(z(t), t, τ_θ(S, V_y))‖², target = ϵ (or v for v-prediction)."""
    parts = encoder.parts
    sched, dev = parts.train_scheduler, parts.device
    z0, eps, t = latents.to(dev, parts.dtype), noise.to(dev, parts.dtype), timesteps.to(dev)
    noisy = sched.add_noise(z0, eps, t)
    kind = sched.config.prediction_type
    if kind not in ("epsilon", "v_prediction"):
        raise FedhetError(f"the scheduler's prediction_type '{kind}' is not supported (epsilon, v_prediction)")
    target = eps if kind == "epsilon" else sched.get_velocity(z0, eps, t)
    states = encoder.encode_labels(concepts.domain, concepts.classes, labels)
    pred = parts.unet(noisy, t, encoder_hidden_states=states.to(parts.dtype)).sample
    return F.mse_loss(pred.float(), target.float())


def check_frozen(encoder: PromptEncoder) -> None:
    """A FedhetError if any UNet / text encoder / VAE parameter would be trained (θ is frozen, §4.2)."""
    parts = encoder.parts
    for name, net in (("vae", parts.vae), ("unet", parts.unet), ("text_encoder", parts.text_encoder)):
        if any(p.requires_grad for p in net.parameters()):
            raise FedhetError(f"the LDM's {name} has trainable parameters: FedBiP trains only S and V (θ frozen)")


def learn_concepts(encoder: PromptEncoder, init: Concepts, latents: torch.Tensor, labels: torch.Tensor,
                   config: ConceptConfig, generator: torch.Generator) -> tuple[Concepts, list[float]]:
    """Optimise S and V on Eq. (4) from `init` over the real latents (N, c, h, w) and labels (N,); returns the
    learned (detached, CPU float32) concepts and the per-step losses. Draws (order, t, ϵ) from `generator`."""
    check_frozen(encoder)
    if len(latents) != len(labels) or len(latents) == 0:
        raise FedhetError(f"need one label per latent and at least one, got {len(latents)} and {len(labels)}")
    domain = init.domain.detach().clone().float().requires_grad_(True)
    classes = init.classes.detach().clone().float().requires_grad_(True)
    opt = torch.optim.Adam([domain, classes], lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    losses, steps_t = [], encoder.parts.num_train_timesteps
    for _ in range(config.epochs):
        for batch in torch.randperm(len(latents), generator=generator).split(config.batch_size):
            z0 = latents[batch]
            t = torch.randint(0, steps_t, (len(batch),), generator=generator)
            eps = torch.randn(z0.shape, generator=generator)
            loss = concept_loss(encoder, Concepts(domain, classes), z0, labels[batch], t, eps)
            descend(opt, loss, "FedBiP's concept optimisation (Eq. 4)", "lower ConceptConfig.lr")
            losses.append(loss.item())
    return Concepts(domain, classes).detach(), losses
