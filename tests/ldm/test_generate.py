"""Server generation (Eq. 5): Ŝ perturbation, PNDM + guidance from the uploaded z(T), decode, determinism."""

from __future__ import annotations

import pytest
import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm import (
    FedBiPUpload,
    GenerationConfig,
    LDMComponents,
    PromptEncoder,
    denoise,
    generate,
    perturb_domain,
)


def _upload(enc: PromptEncoder, n: int = 5, seed: int = 0) -> FedBiPUpload:
    g = torch.Generator().manual_seed(seed)
    d = enc.vector_dim
    return FedBiPUpload(torch.randn(n, 4, 8, 8, generator=g), torch.arange(n) % 3,
                        torch.randn(1, d, generator=g), torch.randn(3, 1, d, generator=g))


def test_domain_perturbation_per_image_and_per_upload() -> None:
    domain = torch.randn(2, 16)
    per_image = perturb_domain(domain, 400, 0.1, "image", torch.Generator().manual_seed(0))
    eta = (per_image - domain) / 0.1
    assert per_image.shape == (400, 2, 16) and not torch.equal(per_image[0], per_image[1])
    assert abs(eta.std().item() - 1) < 0.02 and abs(eta.mean().item()) < 0.02
    per_upload = perturb_domain(domain, 4, 0.1, "upload", torch.Generator().manual_seed(0))
    assert torch.equal(per_upload[0], per_upload[3]) and not torch.equal(per_upload[0], domain)
    assert torch.equal(perturb_domain(domain, 3, 0.0, "image", torch.Generator())[1], domain)


def test_denoise_matches_diffusers_stable_diffusion_pipeline(clip_parts: LDMComponents) -> None:
    diffusers = pytest.importorskip("diffusers")
    enc = PromptEncoder(clip_parts)
    g = torch.Generator().manual_seed(0)
    z_t = torch.randn(2, 4, 8, 8, generator=g)
    cond = enc.encode(torch.randn(2, 1, 32, generator=g), torch.randn(2, 1, 32, generator=g)).detach()
    uncond = enc.unconditional(2)
    pipe = diffusers.StableDiffusionPipeline(
        vae=clip_parts.vae, text_encoder=clip_parts.text_encoder, tokenizer=clip_parts.tokenizer, unet=clip_parts.unet,
        scheduler=clip_parts.sampler(), safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    for scale in (7.5, 1.0):
        ref = pipe(prompt_embeds=cond, negative_prompt_embeds=uncond, latents=z_t.clone(), num_inference_steps=4,
                   guidance_scale=scale, height=16, width=16, output_type="latent").images
        assert torch.allclose(denoise(clip_parts, z_t, cond, uncond, 4, scale), ref, atol=1e-5)


def test_generation_shape_range_and_seed_determinism(parts: LDMComponents) -> None:
    enc = PromptEncoder(parts)
    up, config = _upload(enc), GenerationConfig(steps=3, batch_size=2)
    images, labels = generate(enc, up, config, torch.Generator().manual_seed(1))
    assert images.shape == (5, 3, 16, 16) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1 and torch.equal(labels, up.labels)
    again, _ = generate(enc, up, config, torch.Generator().manual_seed(1))
    other, _ = generate(enc, up, config, torch.Generator().manual_seed(2))
    assert torch.equal(images, again) and not torch.equal(images, other)
    signed, _ = generate(enc, up, GenerationConfig(steps=3, value_range="signed"), torch.Generator().manual_seed(1))
    assert signed.min() >= -1 and torch.allclose((signed + 1) / 2, images, atol=1e-5)


def test_generation_starts_from_the_uploaded_latents_and_follows_the_prompt(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts)
    up, config = _upload(enc, n=2), GenerationConfig(steps=3, domain_noise=0.0, guidance_scale=1.0)
    base, _ = generate(enc, up, config, torch.Generator().manual_seed(0))
    seed_free, _ = generate(enc, up, config, torch.Generator().manual_seed(9))
    assert torch.equal(base, seed_free)  # σ = 0: nothing random is left
    moved = FedBiPUpload(up.latents.flip(0), up.labels, up.domain, up.classes)
    flipped, _ = generate(enc, moved, config, torch.Generator())
    assert not torch.allclose(flipped, base)
    other_v = FedBiPUpload(up.latents, up.labels, up.domain, up.classes * 5 + 3)
    assert (generate(enc, other_v, config, torch.Generator())[0] - base).abs().max() > 1e-4  # weak in a random UNet


def test_batching_does_not_change_the_images(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts)
    up = _upload(enc)
    one, _ = generate(enc, up, GenerationConfig(steps=2, batch_size=5, noise_per="upload"), torch.Generator())
    split, _ = generate(enc, up, GenerationConfig(steps=2, batch_size=2, noise_per="upload"), torch.Generator())
    assert torch.allclose(one, split, atol=1e-5)


def test_bad_generation_input_is_refused(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts, mode="token")
    up = FedBiPUpload(torch.zeros(2, 4, 8, 8), torch.tensor([0, 1]), torch.zeros(1, 16), torch.zeros(2, 1, 16))
    with pytest.raises(FedhetError, match="dim 16"):
        generate(enc, up, GenerationConfig(steps=1), torch.Generator())
    bad = FedBiPUpload(torch.zeros(2, 3, 8, 8), torch.tensor([0, 1]), torch.zeros(1, 32), torch.zeros(2, 1, 32))
    with pytest.raises(FedhetError, match="latents must be"):
        generate(enc, bad, GenerationConfig(steps=1), torch.Generator())
    with pytest.raises(FedhetError, match="noise_per"):
        GenerationConfig(noise_per="client")
    with pytest.raises(FedhetError, match="spacing"):
        clip_parts.sampler("uniform")
