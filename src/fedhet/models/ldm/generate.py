"""FedBiP's server-side generation (Alg. 1 ServerUpdate lines 4-7; Eq. 5; App. A; spec §2.3).

For each uploaded (z_i(T), y_i):  Ŝ = S + η, η ~ N(0, σ² I) (σ = `domain_noise`, App. A: 0.1);
x̃_i = 𝒟(ϵ_θ(z_i(T), T, τ_θ(Ŝ, V_{y_i})))  — ϵ_θ(·) here is the whole PNDM denoising loop, started from the
uploaded z_i(T) instead of fresh noise — and (x̃_i, y_i) joins D_syn.

Switches, with the reading of each (the paper states only "PNDM" and σ = 0.1):
- `steps` (50) and `guidance_scale` (7.5): not stated in the paper; the official code runs diffusers'
  StableDiffusionPipeline with PNDM and its default classifier-free guidance, 7.5 against the empty prompt ""
  (padded to the prompt's length); its step count comes from an unpublished config (its helper's default: 50).
  `guidance_scale` <= 1 runs the conditional prediction alone.
- `domain_noise` σ: a standard deviation (the official code adds randn · σ); 0 disables the perturbation
  (Table 3's "no perturb." row).
- `noise_per`: "image" (default: a fresh η per generated image, the diversity §4.3 asks of the perturbation) or
  "upload" (one η per client upload, as the official generation script draws it). The paper does not say.
- `spacing`: the PNDM timestep spacing; None keeps the checkpoint's (SD: "leading" with steps_offset 1, so 50 steps
  start at t = 981 while z(T) was noised to t = 999, as in the official code); "trailing" starts at t = 999.
- `value_range`: the images' range, "unit" [0, 1] (default) or "signed" [-1, 1].
PNDM is deterministic given its start, so with a seeded generator (it draws only η) generation is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm.client import FedBiPUpload
from fedhet.models.ldm.components import LDMComponents
from fedhet.models.ldm.latents import check_latents, decode_latents
from fedhet.models.ldm.prompts import PromptEncoder

NOISE_PER = ("image", "upload")


@dataclass
class GenerationConfig:
    """Server generation switches (module doc): PNDM steps, CFG scale, σ of Ŝ, η per image or upload."""

    steps: int = 50
    guidance_scale: float = 7.5
    domain_noise: float = 0.1
    noise_per: str = "image"
    batch_size: int = 8
    spacing: str | None = None
    value_range: str = "unit"

    def __post_init__(self) -> None:
        if self.noise_per not in NOISE_PER:
            raise FedhetError(f"unknown noise_per '{self.noise_per}'; valid: {', '.join(NOISE_PER)}")
        if self.steps < 1 or self.batch_size < 1 or self.domain_noise < 0:
            raise FedhetError(f"need steps >= 1, batch_size >= 1 and domain_noise >= 0, got {self.steps}, "
                              f"{self.batch_size} and {self.domain_noise}")


def perturb_domain(domain: torch.Tensor, n: int, sigma: float, per: str,
                   generator: torch.Generator) -> torch.Tensor:
    """Ŝ (n, n_s, d) = S + σ η with η ~ N(0, I) per image (`per="image"`) or shared by all n ("upload")."""
    shape = (n if per == "image" else 1, *domain.shape)
    eta = torch.randn(shape, generator=generator).to(domain.device, domain.dtype)
    return (domain.unsqueeze(0) + sigma * eta).expand(n, -1, -1)


@torch.no_grad()
def denoise(parts: LDMComponents, start: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor | None,
            steps: int, guidance_scale: float, spacing: str | None = None) -> torch.Tensor:
    """z̃(0) from `start` = z(T) (B, c, h, w) by PNDM under τ_θ states `cond` (B, L, D); with `uncond` and
    guidance_scale > 1, classifier-free guidance ϵ = ϵ_u + s (ϵ_c − ϵ_u)."""
    sched = parts.sampler(spacing)
    sched.set_timesteps(steps, device=parts.device)
    guided = uncond is not None and guidance_scale > 1
    context = torch.cat([uncond, cond]) if guided and uncond is not None else cond
    context = context.to(parts.device, parts.dtype)
    latents = start.to(parts.device, parts.dtype) * sched.init_noise_sigma
    for t in sched.timesteps:
        model_in = sched.scale_model_input(torch.cat([latents] * 2) if guided else latents, t)
        eps = parts.unet(model_in, t, encoder_hidden_states=context).sample
        if guided:
            eps_u, eps_c = eps.chunk(2)
            eps = eps_u + guidance_scale * (eps_c - eps_u)
        latents = sched.step(eps, t, latents).prev_sample
    return latents  # type: ignore[no-any-return]


@torch.no_grad()
def generate(encoder: PromptEncoder, upload: FedBiPUpload, config: GenerationConfig,
             generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(x̃ (N, C, H, W) float32 on CPU in `config.value_range`, y (N,)): one image per uploaded z_i(T) (Eq. 5),
    in batches of `config.batch_size`; `generator` draws the η of Ŝ."""
    parts = encoder.parts
    check_latents(parts, upload.latents)
    if upload.domain.shape[-1] != encoder.vector_dim:
        raise FedhetError(f"the upload's concept vectors have dim {upload.domain.shape[-1]}, the '{encoder.mode}' "
                          f"encoder needs {encoder.vector_dim}: generate with the client's template and mode")
    n = len(upload.labels)
    domains = perturb_domain(upload.domain.float(), n, config.domain_noise, config.noise_per, generator)
    images = []
    for idx in torch.arange(n).split(config.batch_size):
        cond = encoder.encode(domains[idx], upload.classes.float()[upload.labels[idx]])
        uncond = encoder.unconditional(len(idx)) if config.guidance_scale > 1 else None
        z0 = denoise(parts, upload.latents[idx], cond, uncond, config.steps, config.guidance_scale, config.spacing)
        images.append(decode_latents(parts, z0, config.value_range).cpu())
    if not images:
        return torch.zeros(0), upload.labels.clone()
    return torch.cat(images), upload.labels.clone()
