"""FedBiP's client (Alg. 1 ClientUpdate; §4.2.1 Eq. 3 and §4.2.2 Eq. 4; spec §2.2), as pure functions.

Instance level (no optimisation), per local image i:
  z_i(0) = ℰ(x_i);  i' a random *same-class* partner, i' ≠ i;  γ ~ N(0.5, 0.1²) clipped to [0, 1];
  z̄(0) = γ z_i(0) + (1 − γ) z_i'(0)                                           (Eq. 3)
  z_i(T) = δ(T, z̄(0)) = √ᾱ_T z̄(0) + √(1 − ᾱ_T) ϵ,   ᾱ_T = the DDPM schedule's alphas_cumprod[T − 1]
(the maximum noise level, "T-steps of random noise"; SD: ᾱ_T ≈ 0.0047, 6.8 % of the signal amplitude survives).
Concept level: `learn_concepts` (fedhet.models.ldm.concepts). The upload (`FedBiPUpload`) is {z_i(T), y_i}, S, V
and nothing else, once.

Where the paper is silent: a class with a single local sample has no partner i' ≠ i. `singleton="self"` (default)
pairs it with itself, so z̄(0) = z_i(0) whatever γ (no mixing for that image: weaker privacy, logged as a warning;
the official code's partner rule, index (i + 5) mod n within the class, does the same); `singleton="error"` raises.
One γ, one partner and one ϵ per image; draws come from the caller's generator, on CPU (device-independent).

`start` (START_LATENTS): what the upload's latents are and where the server's denoising starts.
- "fresh" (the method's default, `method_args.start_latent`): the official code (HaokunChen245/FedBiP
  generate.py lines 266 and 285-290) draws `latent = mean + std * randn` afresh for every synthetic image, from
  per-image mean / std files written by a script it does not publish; read here as the Gaussian z_i(T) is drawn
  from. The upload holds its centre m_i = √ᾱ_T z̄(0); the server draws a new start m_i + √(1 − ᾱ_T) ξ,
  ξ ~ N(0, I), for every image it makes, so copies of one upload are genuinely distinct. The server can recover
  z̄(0) = m_i / √ᾱ_T: weaker privacy than the paper's upload (§5.5); the official code likewise keeps a mean.
- "upload" (the paper's Alg. 1 / Eq. 5 read literally): the upload holds one z_i(T) = δ(T, z̄(0)) and every
  copy restarts from it (the deterministic PNDM sampler then makes near-identical copies).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm.components import LDMComponents
from fedhet.models.ldm.concepts import ConceptConfig, init_concepts, learn_concepts
from fedhet.models.ldm.latents import encode_images
from fedhet.models.ldm.prompts import PromptEncoder

log = logging.getLogger(__name__)
SINGLETONS = ("self", "error")
START_LATENTS = ("fresh", "upload")


def sample_gamma(n: int, generator: torch.Generator, mean: float = 0.5, std: float = 0.1) -> torch.Tensor:
    """γ (n,) ~ N(mean, std²) clipped to [0, 1] (§4.2.1: N(0.5, 0.1²))."""
    return (torch.randn(n, generator=generator) * std + mean).clamp(0.0, 1.0)


def same_class_partners(labels: torch.Tensor, generator: torch.Generator, singleton: str = "self") -> torch.Tensor:
    """partner (N,) long: for each i a uniformly drawn j ≠ i with labels[j] == labels[i] (Alg. 1 line 3); a class
    with one sample: itself (`singleton="self"`, warned) or a FedhetError ("error")."""
    if singleton not in SINGLETONS:
        raise FedhetError(f"unknown singleton rule '{singleton}'; valid: {', '.join(SINGLETONS)}")
    labels = labels.cpu().long()
    partners = torch.arange(len(labels))
    for y in labels.unique().tolist():
        members = (labels == y).nonzero().flatten()
        m = len(members)
        if m == 1:
            if singleton == "error":
                raise FedhetError(f"class {y} has a single local sample: no same-class partner i' != i exists "
                                  "(singleton='self' pairs it with itself)")
            log.warning("class %s has a single local sample: its latent is not interpolated (partner = itself)", y)
            continue
        draw = (torch.rand(m, generator=generator) * (m - 1)).long().clamp(max=m - 2)  # uniform in 0..m-2
        own = torch.arange(m)
        partners[members] = members[draw + (draw >= own).long()]  # skip the image's own index
    return partners


def interpolate(latents: torch.Tensor, partners: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """z̄(0) = γ z_i(0) + (1 − γ) z_i'(0) (Eq. 3), γ (N,) broadcast over (c, h, w)."""
    g = gamma.to(latents.device, latents.dtype).view(-1, *([1] * (latents.dim() - 1)))
    return g * latents + (1 - g) * latents[partners.to(latents.device)]


def max_timestep_alpha(scheduler: Any) -> torch.Tensor:  # Any: diffusers scheduler (untyped)
    """ᾱ_T: the DDPM schedule's cumulative α at its last timestep (diffusers index T − 1)."""
    return torch.as_tensor(scheduler.alphas_cumprod[-1])


def max_noise_std(scheduler: Any) -> float:  # Any: diffusers scheduler (untyped)
    """√(1 − ᾱ_T): the std of the noise in z(T) around its centre √ᾱ_T z̄(0) (what `start="fresh"` redraws)."""
    return float((1 - max_timestep_alpha(scheduler).to(torch.float64)).sqrt())


def noise_to_max_timestep(latents: torch.Tensor, scheduler: Any,  # Any: diffusers scheduler (untyped)
                          generator: torch.Generator) -> torch.Tensor:
    """δ(T, z̄(0)) = √ᾱ_T z̄(0) + √(1 − ᾱ_T) ϵ, ϵ ~ N(0, I) drawn on CPU from `generator` (Eq. 1 at t = T)."""
    alpha = max_timestep_alpha(scheduler).to(torch.float64)
    eps = torch.randn(latents.shape, generator=generator).to(latents.device, latents.dtype)
    return alpha.sqrt().item() * latents + (1 - alpha).sqrt().item() * eps


@dataclass
class FedBiPUpload:
    """The one-shot upload (Alg. 1 line 3): z_i(T) (N, c, h, w), y_i (N,), S (n_s, d), V (C, n_v, d)."""

    latents: torch.Tensor
    labels: torch.Tensor
    domain: torch.Tensor
    classes: torch.Tensor

    def __post_init__(self) -> None:
        # one memory layout whatever produced them (the VAE gives channels-last latents, a transport contiguous
        # ones): the UNet's kernels depend on it, so generation from a message is bit-identical in every runtime
        self.latents = self.latents.contiguous()
        if self.latents.dim() != 4 or self.labels.dim() != 1 or len(self.latents) != len(self.labels):
            raise FedhetError(f"an upload needs latents (N, c, h, w) and labels (N,), got "
                              f"{tuple(self.latents.shape)} and {tuple(self.labels.shape)}")
        if self.domain.dim() != 2 or self.classes.dim() != 3 or self.domain.shape[1] != self.classes.shape[2]:
            raise FedhetError(f"an upload needs S (n_s, d) and V (C, n_v, d), got {tuple(self.domain.shape)} and "
                              f"{tuple(self.classes.shape)}")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise FedhetError(f"labels must lie in 0..{len(self.classes) - 1} (one V per class)")

    def tensors(self) -> dict[str, torch.Tensor]:
        """The named tensors that cross the wire, and only those."""
        return {"latents": self.latents, "labels": self.labels, "domain": self.domain, "classes": self.classes}

    def num_bytes(self) -> int:
        """Upload size in bytes (sum of numel × element size of the four tensors)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def instance_latents(parts: LDMComponents, images: torch.Tensor, labels: torch.Tensor,
                     generator: torch.Generator, singleton: str = "self", posterior: str = "sample",
                     value_range: str = "unit", start: str = "upload") -> tuple[torch.Tensor, torch.Tensor]:
    """(z_i(0), upload latents): the real latents (for Eq. 4) and the interpolated ones (Eq. 3), max-noised to
    z_i(T) = δ(T, z̄(0)) (`start="upload"`) or the centre √ᾱ_T z̄(0) of z_i(T)'s Gaussian (`"fresh"`)."""
    if start not in START_LATENTS:
        raise FedhetError(f"unknown start latent '{start}'; valid: {', '.join(START_LATENTS)}")
    z0 = encode_images(parts, images, generator, posterior, value_range)
    partners = same_class_partners(labels, generator, singleton)
    zbar = interpolate(z0, partners, sample_gamma(len(labels), generator))
    if start == "fresh":
        return z0, max_timestep_alpha(parts.train_scheduler).to(torch.float64).sqrt().item() * zbar
    return z0, noise_to_max_timestep(zbar, parts.train_scheduler, generator)


def client_update(encoder: PromptEncoder, images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                  config: ConceptConfig, generator: torch.Generator, init: str = "random",
                  domain_name: str | None = None, class_names: Sequence[str] | None = None,
                  singleton: str = "self") -> FedBiPUpload:
    """Alg. 1 ClientUpdate(k): instance latents z(T) for every image, S and V learned on the real latents."""
    z0, z_t = instance_latents(encoder.parts, images, labels, generator, singleton)
    start = init_concepts(encoder, num_classes, generator, init, domain_name, class_names)
    learned, _ = learn_concepts(encoder, start, z0, labels, config, generator)
    return FedBiPUpload(z_t.cpu(), labels.cpu().long(), learned.domain, learned.classes)
