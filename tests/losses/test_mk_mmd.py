"""MK-MMD: statistics, the beta QP (checked against SLSQP and KKT), fallback, ablation and schedule."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch

import fedhet.losses.mk_mmd_weights as weights_mod
from fedhet.losses import (
    MKMMD,
    BetaQPError,
    KernelWeightSchedule,
    default_gammas,
    fit_beta,
    mk_mmd_statistics,
    solve_beta_qp,
)

LAMBDA_M = 1e-5


# ---------------- independent numpy reference ----------------
def _np_unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _np_stats(x: np.ndarray, y: np.ndarray, gammas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d_u = mean_{s,t} h_u(s,t), Q_uv = sum (h_u - d_u)(h_v - d_v) / (n^2 - 1), by explicit loops."""
    n = len(x)
    h = np.zeros((len(gammas), n * n))
    for u, gam in enumerate(gammas):

        def k(a: np.ndarray, b: np.ndarray, gam: float = gam) -> float:
            return float(np.exp(-np.sum((a - b) ** 2) / gam))

        h[u] = [k(x[s], x[t]) + k(y[s], y[t]) - k(x[s], y[t]) - k(y[s], x[t]) for s in range(n) for t in range(n)]
    d = h.mean(axis=1)
    c = h - d[:, None]
    return d, c @ c.T / (n * n - 1)


def _slsqp_beta(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """min beta^T (Q + lam I) beta, beta^T d = 1, beta >= 0 by SLSQP, in the variable b = beta * ||d|| (scaling)."""
    a = q + LAMBDA_M * np.eye(len(d))
    s = np.linalg.norm(d)
    res = scipy.optimize.minimize(
        lambda b: b @ a @ b / s**2,
        np.full(len(d), 1.0 / d[d > 0].sum() * s) * (d > 0),
        jac=lambda b: 2 * a @ b / s**2,
        constraints=[{"type": "eq", "fun": lambda b: b @ d / s - 1.0, "jac": lambda b: d / s}],
        bounds=[(0.0, None)] * len(d),
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success, res.message
    return res.x / s


def _toy(seed: int, n: int = 12, dim: int = 4, shift: float = 0.6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    y = torch.randn(n, dim, generator=g, dtype=torch.float64)
    y[:, 0] += shift
    return x, y


# ---------------- tests ----------------
def test_default_gammas() -> None:
    g = default_gammas()
    assert g.numel() == 19
    np.testing.assert_allclose(np.log2(g.numpy()), np.arange(-3.5, 1.0001, 0.25), atol=1e-12)
    assert default_gammas(3).numel() == 3
    with pytest.raises(ValueError):
        default_gammas(20)


@pytest.mark.parametrize("seed", [0, 1])
def test_statistics_and_value_match_reference(seed: int) -> None:
    x, y = _toy(seed)
    gam = default_gammas().numpy()
    d_ref, q_ref = _np_stats(_np_unit(x.numpy()), _np_unit(y.numpy()), gam)
    mk = MKMMD()
    d, q = mk.statistics(x, y)
    np.testing.assert_allclose(d.numpy(), d_ref, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(q.numpy(), q_ref, rtol=1e-9, atol=1e-14)
    # the differentiable per-kernel estimates are the same full quadratic d
    np.testing.assert_allclose(mk.kernel_estimates(x, y).detach().numpy(), d_ref, rtol=1e-10, atol=1e-13)
    # row blocking does not change the result
    xn, yn = torch.nn.functional.normalize(x, dim=1), torch.nn.functional.normalize(y, dim=1)
    d2, q2 = mk_mmd_statistics(xn, yn, default_gammas(), max_block_elems=19 * 12 * 5)
    np.testing.assert_allclose(d2.numpy(), d.numpy(), rtol=1e-12)
    np.testing.assert_allclose(q2.numpy(), q.numpy(), rtol=1e-10, atol=1e-16)
    # the loss is beta^T d with the current beta
    fit = mk.fit_weights(x, y)
    assert float(mk(x, y)) == pytest.approx(float(fit.beta.numpy() @ d_ref), rel=1e-10)


@pytest.mark.parametrize(("n", "max_block_elems"), [(2, 2**22), (37, 2**22), (70, 19 * 70 * 4), (70, 5 * 19 * 70 * 8)])
def test_upper_triangle_blocks_match_reference(n: int, max_block_elems: int) -> None:
    """One block, 1-row blocks, 8-row blocks with a short last one: all give the full-grid (d, Q)."""
    x, y = _toy(3, n=n)
    xn, yn = torch.nn.functional.normalize(x, dim=1), torch.nn.functional.normalize(y, dim=1)
    d_ref, q_ref = _np_stats(xn.numpy(), yn.numpy(), default_gammas().numpy())
    d, q = mk_mmd_statistics(xn, yn, default_gammas(), max_block_elems=max_block_elems)
    np.testing.assert_allclose(d.numpy(), d_ref, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(q.numpy(), q_ref, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("gammas", [default_gammas(), default_gammas(5), torch.tensor([0.3, 1.0, 2.0, 4.0, 0.6])])
def test_kernel_stack_by_squaring_matches_exp(gammas: torch.Tensor) -> None:
    """exp(-D / g) = exp(-D / 2g)^2 where a doubled bandwidth exists, a plain exp elsewhere (any order of gammas)."""
    g = gammas.double()
    dists = torch.rand(4, 3, 7, dtype=torch.float64) * 4.0
    plan = weights_mod._squaring_plan(g)
    assert sorted(u for u, _ in plan) == list(range(len(g)))
    assert all(p < 0 or abs(float(g[p]) - 2.0 * float(g[u])) < 1e-12 for u, p in plan)
    got = weights_mod._gaussian_stack(dists, g, plan)
    want = torch.exp(-dists.unsqueeze(0) / g.reshape(-1, 1, 1, 1))
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beta_qp_matches_slsqp_and_kkt(seed: int) -> None:
    x, y = _toy(seed)
    d, q = _np_stats(_np_unit(x.numpy()), _np_unit(y.numpy()), default_gammas().numpy())
    assert np.any(d > 0)
    raw = solve_beta_qp(d, q, LAMBDA_M)
    # feasibility before normalisation
    assert np.all(raw >= -1e-12)
    assert raw @ d == pytest.approx(1.0, abs=1e-9)
    # KKT of the convex QP (A = Q + lam I): A beta - (beta^T A beta) d >= 0, = 0 on the support
    a = q + LAMBDA_M * np.eye(len(d))
    grad = a @ raw - (raw @ a @ raw) * d
    scale = np.abs(a @ raw).max()
    assert np.all(grad >= -1e-7 * scale)
    np.testing.assert_allclose(grad[raw > 1e-9 * raw.max()], 0.0, atol=1e-7 * scale)
    # independent solver, compared after the spec's normalisation to sum 1
    ref = _slsqp_beta(d, q)
    np.testing.assert_allclose(raw / raw.sum(), ref / ref.sum(), atol=1e-5)
    assert raw @ a @ raw <= ref @ a @ ref * (1 + 1e-9)
    fit = MKMMD().fit_weights(x, y)
    assert fit.method == "qp"
    np.testing.assert_allclose(fit.beta.numpy(), raw / raw.sum(), atol=1e-12)
    assert float(fit.beta.sum()) == pytest.approx(1.0, abs=1e-12) and bool((fit.beta >= 0).all())


def test_fitted_beta_beats_uniform_power_ratio() -> None:
    # Gaussians differing in scale along one axis (raw features: normalisation would remove the scale difference).
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64)
    y = torch.randn(40, 2, generator=g, dtype=torch.float64)
    y[:, 0] *= 2.5
    mk = MKMMD(normalize_features=False)
    fit = mk.fit_weights(x, y)
    d, q = fit.d.numpy(), fit.q.numpy()
    a = q + LAMBDA_M * np.eye(len(d))
    uniform = np.full(len(d), 1.0 / len(d))

    def ratio(b: np.ndarray, m: np.ndarray) -> float:
        return float(d @ b / np.sqrt(b @ m @ b))

    b = fit.beta.numpy()
    assert fit.method == "qp"
    assert ratio(b, a) > 1.05 * ratio(uniform, a)
    assert ratio(b, q) > 1.05 * ratio(uniform, q)


def test_fallback_when_no_positive_d() -> None:
    x, _ = _toy(0)
    mk = MKMMD()
    fit = mk.fit_weights(x, x.clone())  # identical samples: every d_u is exactly 0
    assert fit.method == "fallback" and fit.raw_beta is None
    assert float(fit.d.abs().max()) == 0.0
    np.testing.assert_array_equal(mk.beta.numpy(), np.eye(19)[0])  # all ratios 0: argmax picks the first
    d = torch.tensor([-0.3, -0.1, -0.2], dtype=torch.float64)
    q = torch.diag(torch.tensor([1.0, 0.01, 4.0], dtype=torch.float64))  # ratios -0.3, -10, -0.05
    fb = fit_beta(d, q, torch.full((3,), 1 / 3, dtype=torch.float64))
    assert fb.method == "fallback"
    np.testing.assert_array_equal(fb.beta.numpy(), [0.0, 0.0, 1.0])
    with pytest.raises(BetaQPError):
        solve_beta_qp(d.numpy(), q.numpy())


def test_failed_qp_keeps_previous_beta(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> np.ndarray:
        raise BetaQPError("broken")

    monkeypatch.setattr(weights_mod, "solve_beta_qp", broken)
    x, y = _toy(0)
    prev = torch.softmax(torch.arange(19, dtype=torch.float64), 0)
    mk = MKMMD(beta=prev)
    fit = mk.fit_weights(x, y)
    assert fit.method == "kept"
    np.testing.assert_array_equal(mk.beta.numpy(), prev.numpy())


def test_nearly_identical_samples_give_finite_weights() -> None:
    x, _ = _toy(4)
    g = torch.Generator().manual_seed(5)
    fit = MKMMD().fit_weights(x, x + 1e-7 * torch.randn(x.shape, generator=g, dtype=torch.float64))
    assert fit.method == "qp"
    assert bool(torch.isfinite(fit.beta).all()) and float(fit.beta.sum()) == pytest.approx(1.0)


def test_fixed_uniform_ablation_is_mean_of_kernel_mmds() -> None:
    x, y = _toy(6)
    mk = MKMMD.fixed_uniform(5)
    assert mk.gammas.numel() == 5
    np.testing.assert_allclose(mk.beta.numpy(), np.full(5, 0.2))
    d, _ = _np_stats(_np_unit(x.numpy()), _np_unit(y.numpy()), default_gammas(5).numpy())
    assert float(mk(x, y)) == pytest.approx(d.mean(), rel=1e-10)
    assert mk.fit_weights(x, y).method == "fixed"
    np.testing.assert_allclose(mk.beta.numpy(), np.full(5, 0.2))


def test_loss_is_differentiable_and_state_dict_roundtrip() -> None:
    x, y = _toy(7, n=8)
    x = x.float().requires_grad_(True)
    x.data[0] = 0.0  # an all-zero feature row (post-ReLU) must not give NaN
    mk = MKMMD()
    mk.fit_weights(x.detach(), y.float())
    val = mk(x, y.float())
    val.backward()
    assert val.dtype == torch.float32 and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    other = MKMMD()
    other.load_state_dict(mk.state_dict())
    np.testing.assert_array_equal(other.beta.numpy(), mk.beta.numpy())
    with pytest.raises(ValueError):
        MKMMD(beta=[0.5, 0.5])
    with pytest.raises(ValueError):
        mk.fit_weights(x.detach()[:5], y.float())  # fitting needs paired samples


def test_kernel_weight_schedule() -> None:
    periodic = KernelWeightSchedule(interval=20, n_accumulate=50)
    assert [s for s in range(61) if periodic.refit_due(s)] == [0, 20, 40, 60] and not periodic.per_step
    every = KernelWeightSchedule(interval=-1)
    assert every.per_step and all(every.refit_due(s) for s in range(5))
    never = KernelWeightSchedule(interval=0)
    assert not any(never.refit_due(s) for s in range(50))
    with pytest.raises(ValueError):
        KernelWeightSchedule(interval=-2)
