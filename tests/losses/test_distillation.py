"""FedDAT's mutual distillation pieces by hand (Eqs. 5-7, App. B.2)."""

from __future__ import annotations

import math

import torch

from fedhet.losses.distillation import exp_rampup, kl_to_target, warmup_linear_decay


def test_kl_direction_and_value_by_hand() -> None:
    z_s, z_dat = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    p, q = torch.softmax(z_s, -1)[0], torch.softmax(z_dat, -1)[0]
    by_hand = float((p * (p / q).log()).sum())  # KL(z_s || z_DAT): expectation under the trained z_s
    assert math.isclose(float(kl_to_target(z_s, z_dat)), by_hand, rel_tol=1e-6)
    reverse = float((q * (q / p).log()).sum())
    assert not math.isclose(by_hand, reverse, rel_tol=1e-3)  # the two directions differ: the order matters
    t = 3.0
    pt, qt = torch.softmax(z_s / t, -1)[0], torch.softmax(z_dat / t, -1)[0]
    scaled = float((pt * (pt / qt).log()).sum()) * t * t
    assert math.isclose(float(kl_to_target(z_s, z_dat, temperature=t, scale_t2=True)), scaled, rel_tol=1e-6)


def test_kl_gradient_goes_only_into_the_trained_side() -> None:
    z_s, z_dat = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    kl_to_target(z_s, z_dat).backward()
    assert z_s.grad is not None and z_s.grad.abs().sum() > 0 and z_dat.grad is None


def test_rampup_is_exp_minus_five_at_the_start_and_one_at_the_end() -> None:
    assert math.isclose(exp_rampup(0, 10), math.exp(-5))
    assert math.isclose(exp_rampup(5, 10), math.exp(-2.5))
    assert exp_rampup(10, 10) == 1.0 and exp_rampup(12, 10) == 1.0


def test_warmup_then_linear_decay_like_transformers() -> None:
    factors = [warmup_linear_decay(t, 20, 0.1) for t in range(20)]
    assert factors[:3] == [0.0, 0.5, 1.0]  # W = 2 warm-up steps
    assert math.isclose(factors[10], 10 / 18) and math.isclose(factors[19], 1 / 18)
    transformers = __import__("pytest").importorskip("transformers")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = transformers.get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=20)
    theirs = []
    for _ in range(20):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert all(math.isclose(a, b) for a, b in zip(factors, theirs, strict=True))


def test_kl_over_a_restricted_answer_pool_is_finite_with_finite_gradients() -> None:
    """Logits masked to -inf outside a client's pool (restrict_logits) add no term and no NaN."""
    z_s = torch.tensor([[1.0, float("-inf"), 0.5]], requires_grad=True)
    z_dat = torch.tensor([[0.0, float("-inf"), 1.0]])
    kl = kl_to_target(z_s, z_dat)
    kl.backward()
    expected = kl_to_target(torch.tensor([[1.0, 0.5]]), torch.tensor([[0.0, 1.0]]))
    assert torch.isfinite(kl) and torch.allclose(kl, expected)
    assert torch.isfinite(z_s.grad[0, [0, 2]]).all()
