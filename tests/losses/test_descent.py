"""`descend`, the one gradient step: a NaN / inf loss stops before the weights move, the step is plain
zero_grad / backward / clip / step, and no other module of fedhet calls backward() (issue 39 item 3)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from fedhet.errors import TrainingDivergedError
from fedhet.losses.descent import check_finite, descend

SRC = Path(__file__).resolve().parents[2] / "src" / "fedhet"


def test_a_nonfinite_loss_stops_before_the_weights_move() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    descend(opt, (w * 2).sum(), "x", "y")  # leaves a gradient behind: the next step must not reuse it
    before = w.detach().clone()
    with pytest.raises(TrainingDivergedError, match=r"loss became nan in the test loop; lower the lr"):
        descend(opt, (w * math.nan).sum(), "the test loop", "lower the lr")
    assert torch.equal(w.detach(), before)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_check_finite_stops_a_scalar_and_a_vector_loss(bad: float) -> None:
    """The one-element loss is read as a float (issue 42), a loss of several elements checked whole."""
    check_finite(torch.tensor(2.5, requires_grad=True) * 2, "x", "y")
    check_finite(torch.tensor([1.0, 2.0]), "x", "y")
    with pytest.raises(TrainingDivergedError, match=f"loss became {bad} in a scalar"):
        check_finite(torch.tensor([bad]), "a scalar", "y")
    with pytest.raises(TrainingDivergedError, match="non-finite in 1 of its 3 elements in a vector"):
        check_finite(torch.tensor([1.0, bad, 3.0]), "a vector", "y")


def test_one_step_is_zero_grad_backward_edit_clip_step() -> None:
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([w], lr=1.0)
    descend(opt, (w * w).sum() / 2, "x", "y")  # gradient w = (3, 4): w -> 0
    assert torch.equal(w.detach(), torch.zeros(2))
    w.data = torch.tensor([3.0, 4.0])
    edited = []
    descend(opt, (w * w).sum() / 2, "x", "y", clip=([w], 1.0), before_step=lambda: edited.append(w.grad.clone()))
    assert torch.equal(edited[0], torch.tensor([3.0, 4.0]))  # the previous gradient was zeroed, not summed
    assert torch.allclose(w.detach(), torch.tensor([3.0 - 0.6, 4.0 - 0.8]))  # the norm-5 gradient clipped to 1


def test_no_other_module_calls_backward() -> None:
    calls = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if re.search(r"\.backward\(", p.read_text())}
    assert calls == {"losses/descent.py"}, "take gradient steps through fedhet.losses.descent.descend"
