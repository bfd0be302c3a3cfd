"""The VAE latent space of FedBiP: z(0) = ℰ(x) and x̃ = 𝒟(z̃(0)) (spec fedbip.md §1.2).

Images come in the classifier's range, float (B, C, H, W) in [0, 1] (`value_range="unit"`, torchvision's
ToTensor) or [-1, 1] ("signed", what the SD VAE was trained on); they are mapped to [-1, 1] for ℰ and back for 𝒟.
Latents are scaled as in Stable Diffusion training: z = (ℰ(x) - shift) · scaling_factor (SD: 0.18215, no
shift), so that they have about unit variance and the DDPM schedule applies as trained.

`posterior`: ℰ gives a diagonal Gaussian; "sample" draws from it (SD training, diffusers' textual-inversion
script and the official FedBiP code), "mean" takes its mean (deterministic). The paper does not say (spec §2.6
"OPEN: VAE mean vs sample"); default "sample".

Shape checks (FedhetError): 4-D, the VAE's channel count, a side divisible by vae_factor · unet_factor (the
latent must pass the UNet's down/up path), values inside the declared range.
"""

from __future__ import annotations

import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm.components import LDMComponents

RANGES = ("unit", "signed")
POSTERIORS = ("sample", "mean")
RANGE_SLACK = 1e-3


def check_images(parts: LDMComponents, images: torch.Tensor, value_range: str = "unit") -> None:
    """A FedhetError unless `images` is a float (B, C, H, W) batch the VAE and UNet accept, in `value_range`."""
    if value_range not in RANGES:
        raise FedhetError(f"unknown value_range '{value_range}'; valid: {', '.join(RANGES)}")
    channels, side = int(parts.vae.config.in_channels), parts.vae_factor * parts.unet_factor
    if images.dim() != 4 or not images.is_floating_point():
        raise FedhetError(f"the VAE takes float images (B, C, H, W), got {images.dtype} {tuple(images.shape)}")
    b, c, h, w = images.shape
    if c != channels:
        raise FedhetError(f"the VAE takes {channels}-channel images, got {c} channels (shape {tuple(images.shape)})")
    if h % side or w % side or h == 0 or w == 0:
        raise FedhetError(f"image size {h}x{w} does not fit the LDM: height and width must be positive multiples of "
                          f"{side} (VAE downsampling {parts.vae_factor} x UNet downsampling {parts.unet_factor}); "
                          "resize the images first")
    low = 0.0 if value_range == "unit" else -1.0
    if b and (images.min().item() < low - RANGE_SLACK or images.max().item() > 1.0 + RANGE_SLACK):
        raise FedhetError(f"images must lie in [{low:g}, 1] (value_range='{value_range}'), got "
                          f"[{images.min().item():.3g}, {images.max().item():.3g}]: pass unnormalised images")


def check_latents(parts: LDMComponents, latents: torch.Tensor) -> None:
    """A FedhetError unless `latents` is (N, c, h, w) with the VAE's c and sides the UNet accepts."""
    side = parts.unet_factor
    if latents.dim() != 4 or latents.shape[1] != parts.latent_channels or latents.shape[2] % side \
            or latents.shape[3] % side:
        raise FedhetError(f"latents must be (N, {parts.latent_channels}, h, w) with h, w multiples of {side}, got "
                          f"{tuple(latents.shape)}")


@torch.no_grad()
def encode_images(parts: LDMComponents, images: torch.Tensor, generator: torch.Generator | None = None,
                  posterior: str = "sample", value_range: str = "unit", batch_size: int = 32) -> torch.Tensor:
    """z(0) = scaling · (ℰ(x) - shift), (B, c, H/f, W/f), on the LDM's device; `generator` for "sample"."""
    check_images(parts, images, value_range)
    if posterior not in POSTERIORS:
        raise FedhetError(f"unknown posterior '{posterior}'; valid: {', '.join(POSTERIORS)}")
    config, out = parts.vae.config, []
    for chunk in images.split(batch_size):
        x = chunk.to(parts.device, parts.vae.dtype)
        dist = parts.vae.encode(x * 2 - 1 if value_range == "unit" else x).latent_dist
        out.append(dist.sample(generator=generator) if posterior == "sample" else dist.mean)
    z = torch.cat(out) if out else images.new_zeros((0, parts.latent_channels, 1, 1))
    shift = getattr(config, "shift_factor", None) or 0.0
    return (z - shift) * float(config.scaling_factor)


@torch.no_grad()
def decode_latents(parts: LDMComponents, latents: torch.Tensor, value_range: str = "unit",
                   batch_size: int = 32) -> torch.Tensor:
    """x̃ = 𝒟(z̃(0) / scaling + shift), clamped to `value_range` ([0, 1] "unit" or [-1, 1] "signed"), float32."""
    if value_range not in RANGES:
        raise FedhetError(f"unknown value_range '{value_range}'; valid: {', '.join(RANGES)}")
    check_latents(parts, latents)
    config, out = parts.vae.config, []
    shift = getattr(config, "shift_factor", None) or 0.0
    for chunk in latents.split(batch_size):
        z = chunk.to(parts.device, parts.vae.dtype) / float(config.scaling_factor) + shift
        x = parts.vae.decode(z).sample.float().clamp(-1, 1)
        out.append((x + 1) / 2 if value_range == "unit" else x)
    return torch.cat(out)
