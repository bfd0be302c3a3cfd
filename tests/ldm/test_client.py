"""FedBiP instance-level personalization (Eq. 3, δ(T, ·)) and the upload, checked by hand."""

from __future__ import annotations

import logging

import pytest
import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm import (
    ConceptConfig,
    FedBiPUpload,
    LDMComponents,
    PromptEncoder,
    client_update,
    instance_latents,
    interpolate,
    noise_to_max_timestep,
    same_class_partners,
    sample_gamma,
)


def test_gamma_is_normal_half_tenth_clipped_to_unit_interval() -> None:
    gamma = sample_gamma(40_000, torch.Generator().manual_seed(0))
    assert gamma.shape == (40_000,)
    assert abs(gamma.mean().item() - 0.5) < 0.003 and abs(gamma.std().item() - 0.1) < 0.003  # std, not variance
    shifted = sample_gamma(40_000, torch.Generator().manual_seed(1), mean=0.95, std=0.1)
    assert shifted.min() >= 0 and shifted.max() == 1.0
    # P(N(0.95, 0.1²) > 1) = P(Z > 0.5) = 0.3085: that mass sits exactly at 1 after clipping
    assert abs((shifted == 1.0).float().mean().item() - 0.3085) < 0.01
    low = sample_gamma(40_000, torch.Generator().manual_seed(2), mean=0.02, std=0.1)
    assert low.min() == 0.0 and abs((low == 0.0).float().mean().item() - 0.4207) < 0.01  # P(Z < -0.2)


def test_gamma_is_reproducible_from_the_generator() -> None:
    a = sample_gamma(5, torch.Generator().manual_seed(7))
    assert torch.equal(a, sample_gamma(5, torch.Generator().manual_seed(7)))
    assert not torch.equal(a, sample_gamma(5, torch.Generator().manual_seed(8)))


def test_partners_are_same_class_never_self_and_uniform() -> None:
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, 1, 0])
    for seed in range(20):
        partners = same_class_partners(labels, torch.Generator().manual_seed(seed))
        assert torch.equal(labels[partners], labels)
        assert (partners != torch.arange(len(labels))).all()
    counts = torch.zeros(4, dtype=torch.long)  # class 0 = indices 0, 2, 5, 9: index 0 picks 2, 5, 9 uniformly
    for seed in range(600):
        counts[[0, 2, 5, 9].index(int(same_class_partners(labels, torch.Generator().manual_seed(seed))[0]))] += 1
    assert counts[0] == 0 and (counts[1:] - 200).abs().max() < 50


def test_a_singleton_class_pairs_with_itself_or_raises(caplog: pytest.LogCaptureFixture) -> None:
    labels = torch.tensor([0, 0, 1, 0])
    with caplog.at_level(logging.WARNING):
        partners = same_class_partners(labels, torch.Generator().manual_seed(0))
    assert partners[2] == 2 and "single local sample" in caplog.text
    assert (partners[[0, 1, 3]] != torch.tensor([0, 1, 3])).all()
    with pytest.raises(FedhetError, match="single local sample"):
        same_class_partners(labels, torch.Generator().manual_seed(0), singleton="error")
    with pytest.raises(FedhetError, match="singleton rule"):
        same_class_partners(labels, torch.Generator(), singleton="drop")


def test_interpolation_is_eq3() -> None:
    z = torch.arange(3 * 2 * 1 * 1, dtype=torch.float32).view(3, 2, 1, 1)
    out = interpolate(z, torch.tensor([2, 0, 0]), torch.tensor([0.25, 1.0, 0.5]))
    expected = torch.stack([0.25 * z[0] + 0.75 * z[2], z[1], 0.5 * z[2] + 0.5 * z[0]])
    assert torch.allclose(out, expected)


def test_noising_to_t_uses_the_last_alpha_bar_of_sd_betas(clip_parts: LDMComponents) -> None:
    # ᾱ_T from SD v1-4's scaled-linear betas by hand, not from the scheduler
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    alpha_bar = torch.prod(1 - betas).item()
    assert abs(alpha_bar - 0.00466) < 5e-5
    z = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    out = noise_to_max_timestep(z, clip_parts.train_scheduler, torch.Generator().manual_seed(5))
    eps = torch.randn(z.shape, generator=torch.Generator().manual_seed(5))
    assert torch.allclose(out, alpha_bar**0.5 * z + (1 - alpha_bar) ** 0.5 * eps, atol=1e-5)
    via = clip_parts.train_scheduler.add_noise(z, eps, torch.full((3,), 999))
    assert torch.allclose(out, via, atol=1e-5)


def test_instance_latents_interpolate_same_class_then_noise(clip_parts: LDMComponents) -> None:
    images = torch.rand(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 0, 1, 0])
    z0, z_t = instance_latents(clip_parts, images, labels, torch.Generator().manual_seed(3), posterior="mean")
    assert z0.shape == z_t.shape == (5, 4, 8, 8)
    g = torch.Generator().manual_seed(3)  # replay the draws in the documented order: partners, γ, ϵ
    partners = same_class_partners(labels, g)
    zbar = interpolate(z0, partners, sample_gamma(5, g))
    assert torch.allclose(z_t, noise_to_max_timestep(zbar, clip_parts.train_scheduler, g), atol=1e-6)


def test_upload_holds_exactly_latents_labels_and_concepts() -> None:
    up = FedBiPUpload(torch.zeros(6, 4, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2]), torch.zeros(2, 32),
                      torch.zeros(3, 1, 32))
    assert set(up.tensors()) == {"latents", "labels", "domain", "classes"}
    assert up.num_bytes() == 6 * 4 * 8 * 8 * 4 + 6 * 8 + 2 * 32 * 4 + 3 * 32 * 4
    with pytest.raises(FedhetError, match="one V per class"):
        FedBiPUpload(torch.zeros(2, 4, 8, 8), torch.tensor([0, 3]), torch.zeros(1, 32), torch.zeros(3, 1, 32))
    with pytest.raises(FedhetError, match="labels"):
        FedBiPUpload(torch.zeros(2, 4, 8, 8), torch.tensor([0]), torch.zeros(1, 32), torch.zeros(3, 1, 32))


def test_client_update_uploads_one_noised_latent_per_image(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts, n_domain=2, n_class=1)
    images, labels = torch.rand(6, 3, 16, 16), torch.tensor([0, 0, 1, 1, 2, 2])
    up = client_update(enc, images, labels, 3, ConceptConfig(epochs=1, batch_size=3), torch.Generator().manual_seed(0))
    assert up.latents.shape == (6, 4, 8, 8) and torch.equal(up.labels, labels)
    assert up.domain.shape == (2, 32) and up.classes.shape == (3, 1, 32)
    assert not up.domain.requires_grad and not up.classes.requires_grad
