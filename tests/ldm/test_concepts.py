"""Concept-level personalization (Eq. 4): S and V learn, the LDM stays frozen and gets no gradient."""

from __future__ import annotations

import pytest
import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm import (
    ConceptConfig,
    LDMComponents,
    PromptEncoder,
    concept_loss,
    init_concepts,
    learn_concepts,
    tiny_components,
)

LABELS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])


def _problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(8, 4, 8, 8, generator=g), torch.randint(0, 1000, (8,), generator=g),
            torch.randn(8, 4, 8, 8, generator=g))


@pytest.mark.parametrize("mode", ["token", "output"])
def test_concepts_learn_the_eps_loss_with_the_ldm_frozen(parts: LDMComponents, mode: str) -> None:
    enc = PromptEncoder(parts, mode=mode)
    z0, t, eps = _problem()
    g = torch.Generator().manual_seed(1)
    start = init_concepts(enc, 4, g)
    before = concept_loss(enc, start, z0, LABELS, t, eps).item()
    learned, losses = learn_concepts(enc, start, z0, LABELS, ConceptConfig(epochs=10, batch_size=8), g)
    after = concept_loss(enc, learned, z0, LABELS, t, eps).item()
    assert len(losses) == 10 and after < before - 0.004  # held-out draws (t, ϵ): the fit generalises over them
    assert not torch.equal(learned.domain, start.domain) and not torch.equal(learned.classes, start.classes)
    for net in (parts.unet, parts.text_encoder, parts.vae):
        assert all(p.grad is None and not p.requires_grad for p in net.parameters())


def test_first_adam_step_moves_each_coordinate_by_lr(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts)
    z0, _, _ = _problem()
    start = init_concepts(enc, 4, torch.Generator().manual_seed(0))
    learned, losses = learn_concepts(enc, start, z0, LABELS, ConceptConfig(epochs=1, batch_size=8),
                                     torch.Generator().manual_seed(0))
    assert len(losses) == 1
    step = (learned.domain - start.domain).abs()  # Adam's first step: lr · g / (|g| + eps) = lr per coordinate
    assert torch.allclose(step, torch.full_like(step, 0.1), atol=1e-3)


def test_only_classes_in_the_batch_move(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts)
    z0, _, _ = _problem()
    start = init_concepts(enc, 6, torch.Generator().manual_seed(0))
    learned, _ = learn_concepts(enc, start, z0, LABELS, ConceptConfig(epochs=1), torch.Generator())
    assert torch.equal(learned.classes[4:], start.classes[4:]) and not torch.equal(learned.classes[:4],
                                                                                      start.classes[:4])


def test_a_trainable_ldm_part_is_refused() -> None:
    parts = tiny_components("clip", seed=1)
    enc = PromptEncoder(parts)
    start = init_concepts(enc, 4, torch.Generator())
    next(iter(parts.unet.parameters())).requires_grad_(True)
    with pytest.raises(FedhetError, match="unet has trainable parameters"):
        learn_concepts(enc, start, _problem()[0], LABELS, ConceptConfig(epochs=1), torch.Generator())


def test_mismatched_latents_and_labels_are_refused(clip_parts: LDMComponents) -> None:
    enc = PromptEncoder(clip_parts)
    start = init_concepts(enc, 4, torch.Generator())
    with pytest.raises(FedhetError, match="one label per latent"):
        learn_concepts(enc, start, _problem()[0], LABELS[:5], ConceptConfig(epochs=1), torch.Generator())
