"""Cosine-similarity penalty and softmax entropy: values and sign conventions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fedhet.losses as losses
from fedhet.losses import cosine_similarity_penalty, softmax_entropy


def test_cosine_penalty_values() -> None:
    g = torch.Generator().manual_seed(0)
    f = torch.randn(6, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert cosine_similarity_penalty(f, f.detach()).item() == pytest.approx(0.0, abs=1e-12)
    assert cosine_similarity_penalty(f, 3.0 * f.detach()).item() == pytest.approx(0.0, abs=1e-12)
    assert cosine_similarity_penalty(f, -f.detach()).item() == pytest.approx(2.0, abs=1e-12)
    e = torch.eye(2, dtype=torch.float64)
    assert float(cosine_similarity_penalty(e, e.flip(0))) == pytest.approx(1.0)
    other = torch.randn(6, 2, 3, generator=g, dtype=torch.float64)
    val = cosine_similarity_penalty(f, other)
    a, b = f.detach().reshape(6, -1).numpy(), other.reshape(6, -1).numpy()
    ref = np.mean(1 - (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
    assert val.item() == pytest.approx(ref, rel=1e-12)
    val.backward()
    assert torch.isfinite(f.grad).all()
    with pytest.raises(ValueError):
        cosine_similarity_penalty(f, other[:5])


def test_softmax_entropy_sign_and_extremes() -> None:
    assert float(softmax_entropy(torch.zeros(4, 7))) == pytest.approx(math.log(7), rel=1e-6)
    one_hot = torch.full((3, 5), -50.0)
    one_hot[:, 2] = 50.0
    assert 0.0 <= float(softmax_entropy(one_hot)) < 1e-6
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 4, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, 1).numpy()
    assert float(softmax_entropy(logits)) == pytest.approx(float(np.mean(-(p * np.log(p)).sum(1))), rel=1e-12)
    masked = torch.tensor([[0.0, 0.0, -math.inf]], requires_grad=True)
    val = softmax_entropy(masked)
    val.backward()
    assert val.item() == pytest.approx(math.log(2)) and torch.isfinite(masked.grad).all()


def test_public_api_exports() -> None:
    for name in losses.__all__:
        assert hasattr(losses, name), name
