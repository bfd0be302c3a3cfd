"""Per-sample membership scores by hand on a fixed linear model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fedhet.privacy.scores import MEMBER_IS_LOWER, SCORES, sample_scores, scores_from_logits

LN2, LN3 = math.log(2.0), math.log(3.0)


def fixed_model() -> nn.Module:
    """logits = W x with x one-hot: x = e0 gives logits (ln 2, 0, 0) -> p = (1/2, 1/4, 1/4); x = e1 gives
    (0, 0, 0) -> p = (1/3, 1/3, 1/3)."""
    model = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[LN2, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    return model


def samples() -> TensorDataset:
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    return TensorDataset(x, torch.tensor([0, 1, 2]))


# by hand: (loss, entropy, modified entropy, confidence) of the three samples
EXPECTED = {
    # p = (1/2, 1/4, 1/4), y = 0: -ln 1/2; H = 1/2 ln 2 + 2 * 1/4 ln 4 = 3/2 ln 2;
    # Mentr = -(1 - 1/2) ln 1/2 - 2 * 1/4 ln(3/4)
    "loss": [LN2, 2 * LN2, LN3],
    "entropy": [1.5 * LN2, 1.5 * LN2, LN3],
    # y = 1: -(3/4) ln(1/4) - (1/2 ln(1/2) + 1/4 ln(3/4)); uniform: -(2/3) ln(1/3) - 2 * 1/3 ln(2/3)
    "modified_entropy": [0.5 * LN2 - 0.5 * math.log(0.75), 2 * LN2 - 0.25 * math.log(0.75),
                         (2 / 3) * LN3 - (2 / 3) * math.log(2 / 3)],
    "confidence": [0.5, 0.25, 1 / 3],
}


@pytest.mark.parametrize("batch_size", [1, 2, 256])
def test_scores_by_hand(batch_size: int) -> None:
    got = sample_scores(fixed_model(), samples(), torch.device("cpu"), batch_size=batch_size)
    assert set(got) == set(SCORES)
    for name, values in EXPECTED.items():
        np.testing.assert_allclose(got[name], values, rtol=1e-6, err_msg=name)
        assert got[name].dtype == np.float64


def test_loss_is_the_engines_cross_entropy() -> None:
    logits, y = torch.randn(7, 5, generator=torch.Generator().manual_seed(0)), torch.arange(7) % 5
    got = scores_from_logits(logits, y)["loss"]
    torch.testing.assert_close(got.float(), nn.functional.cross_entropy(logits, y, reduction="none"))


def test_restricted_classes_are_masked() -> None:
    """A client-specific head over classes (0, 1): class 2 gets p = 0, as in the engine's evaluation."""
    model = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 0.0], [5.0, 5.0]]))
    data = TensorDataset(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    got = sample_scores(model, data, torch.device("cpu"), classes=(0, 1))
    np.testing.assert_allclose([got["loss"][0], got["entropy"][0], got["confidence"][0]], [LN2, LN2, 0.5])
    # Mentr = -(1/2) ln(1/2) - 1/2 ln(1/2) (the masked class adds 0 ln 1)
    np.testing.assert_allclose(got["modified_entropy"][0], LN2)


def test_confidently_wrong_modified_entropy_is_floored() -> None:
    """p_y ~ e^-200 and the wrong class at ~1: each log is floored at ln 1e-30 (Song & Mittal's log_value)."""
    got = scores_from_logits(torch.tensor([[100.0, -100.0, 0.0]]), torch.tensor([1]))
    assert float(got["loss"][0]) == pytest.approx(200.0)
    assert float(got["modified_entropy"][0]) == pytest.approx(-2 * math.log(1e-30))
    assert float(got["entropy"][0]) == pytest.approx(0.0, abs=1e-30)


def test_directions() -> None:
    assert MEMBER_IS_LOWER == {"loss": True, "entropy": True, "modified_entropy": True, "confidence": False}
