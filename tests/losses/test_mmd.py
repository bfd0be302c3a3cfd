"""Gaussian kernels and MMD^2 estimators against direct double-loop numpy computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.losses import (
    gaussian_kernel,
    gaussian_mmd,
    h_matrix,
    median_heuristic_sigma,
    mmd2_biased,
    mmd2_unbiased,
    mmd2_unbiased_paired,
    pairwise_sq_dists,
    rbf_kernel,
)


def _k(a: np.ndarray, b: np.ndarray, sigma: float) -> float:
    return float(np.exp(-np.sum((a - b) ** 2) / (2.0 * sigma**2)))


def _np_mmd2(x: np.ndarray, y: np.ndarray, sigma: float, unbiased: bool) -> float:
    n, m = len(x), len(y)
    sxx = sum(_k(x[i], x[j], sigma) for i in range(n) for j in range(n) if not (unbiased and i == j))
    syy = sum(_k(y[i], y[j], sigma) for i in range(m) for j in range(m) if not (unbiased and i == j))
    sxy = sum(_k(x[i], y[j], sigma) for i in range(n) for j in range(m))
    if unbiased:
        return sxx / (n * (n - 1)) + syy / (m * (m - 1)) - 2.0 * sxy / (n * m)
    return sxx / n**2 + syy / m**2 - 2.0 * sxy / (n * m)


def _np_median_sigma(x: np.ndarray, y: np.ndarray) -> float:
    z = np.concatenate([x, y])
    return float(np.median([np.linalg.norm(z[i] - z[j]) for i in range(len(z)) for j in range(i + 1, len(z))]))


@pytest.fixture
def xy() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(9, 3, generator=g, dtype=torch.float64), 0.7 + torch.randn(
        7, 3, generator=g, dtype=torch.float64
    )


def test_pairwise_sq_dists_and_kernel_conventions(xy) -> None:
    x, y = xy
    d2 = np.array([[np.sum((a - b) ** 2) for b in y.numpy()] for a in x.numpy()])
    np.testing.assert_allclose(pairwise_sq_dists(x, y).numpy(), d2, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gaussian_kernel(x, y, 1.3).numpy(), np.exp(-d2 / (2 * 1.3**2)), rtol=1e-10)
    np.testing.assert_allclose(rbf_kernel(x, y, 0.5).numpy(), np.exp(-d2 / 0.5), rtol=1e-10)
    stack = rbf_kernel(x, y, torch.tensor([0.5, 2.0], dtype=torch.float64))
    assert stack.shape == (2, 9, 7)
    np.testing.assert_allclose(stack[1].numpy(), gaussian_kernel(x, y, 1.0).numpy(), rtol=1e-12)


@pytest.mark.parametrize("estimator", ["biased", "unbiased"])
@pytest.mark.parametrize("sigma", [0.8, None])
def test_gaussian_mmd_matches_double_loop(xy, estimator: str, sigma: float | None) -> None:
    x, y = xy
    xn, yn = x.numpy(), y.numpy()
    s = _np_median_sigma(xn, yn) if sigma is None else sigma
    expected = _np_mmd2(xn, yn, s, unbiased=estimator == "unbiased")
    assert float(gaussian_mmd(x, y, sigma, estimator=estimator)) == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_median_heuristic_matches_numpy(xy) -> None:
    x, y = xy
    assert float(median_heuristic_sigma(x, y)) == pytest.approx(_np_median_sigma(x.numpy(), y.numpy()), rel=1e-12)
    z = torch.zeros(4, 2, dtype=torch.float64)
    assert float(median_heuristic_sigma(z, z)) == 1.0  # degenerate sample: documented fallback


def test_same_distribution_near_zero_and_monotone_in_mean_shift() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 2, generator=g, dtype=torch.float64)
    y = torch.randn(200, 2, generator=g, dtype=torch.float64)
    assert abs(float(gaussian_mmd(x, y, 1.0, estimator="unbiased"))) < 5e-3
    assert 0.0 <= float(gaussian_mmd(x, y, 1.0)) < 2e-2
    for estimator in ("biased", "unbiased"):
        for sigma in (1.0, None):
            vals = [float(gaussian_mmd(x, y + s, sigma, estimator=estimator)) for s in (0.0, 0.25, 0.5, 1.0, 2.0)]
            assert all(a < b for a, b in zip(vals, vals[1:], strict=False)), (estimator, sigma, vals)


def test_estimators_on_kernel_stacks_and_paired_u_statistic(xy) -> None:
    x, y = xy[0][:6], xy[1][:6]
    sig = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    kxx, kyy, kxy = gaussian_kernel(x, x, sig), gaussian_kernel(y, y, sig), gaussian_kernel(x, y, sig)
    for i, s in enumerate(sig.tolist()):
        assert float(mmd2_biased(kxx, kyy, kxy)[i]) == pytest.approx(float(gaussian_mmd(x, y, s)), rel=1e-12)
        assert float(mmd2_unbiased(kxx, kyy, kxy)[i]) == pytest.approx(
            float(gaussian_mmd(x, y, s, estimator="unbiased")), rel=1e-12
        )
    # Liu et al. Eq. 2: mean over i != j of H_ij.
    k0 = (kxx[0].numpy(), kyy[0].numpy(), kxy[0].numpy())
    n = 6
    hij = [k0[0][i, j] + k0[1][i, j] - k0[2][i, j] - k0[2][j, i] for i in range(n) for j in range(n) if i != j]
    assert float(mmd2_unbiased_paired(kxx, kyy, kxy)[0]) == pytest.approx(np.mean(hij), rel=1e-12)
    with pytest.raises(ValueError):
        h_matrix(kxx, kyy[:, :5, :5], kxy)


def test_gaussian_mmd_single_prototype_and_gradients() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    proto = torch.randn(1, 4, generator=g, dtype=torch.float64)
    val = gaussian_mmd(torch.cat([x, x[:1]]), proto)  # m = 1 works with the biased estimator; duplicate rows
    val.backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        gaussian_mmd(x.detach(), proto, estimator="unbiased")
    with pytest.raises(ValueError):
        gaussian_mmd(x.detach(), proto, estimator="linear")  # type: ignore[arg-type]
