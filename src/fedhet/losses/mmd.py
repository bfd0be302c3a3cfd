"""MMD^2 estimators from kernel matrices, and the single-bandwidth Gaussian MMD used by FRAug (Eqs. 5-6).

With K_xx (n, n), K_yy (m, m), K_xy (n, m) (any leading batch dims, e.g. a (K, ., .) stack of kernels):

- biased / V-statistic (Gretton et al. 2012 JMLR, Eq. 5):
      MMD_b^2 = mean(K_xx) + mean(K_yy) - 2 mean(K_xy).
  For n = m this is the spec's "full quadratic estimator" d_hat = mean_{s,t} h(z_s, z_t) over all n x n pairs,
  diagonal included (ditto_mmd.md §2.3), with h(z_s, z_t) = k(x_s,x_t) + k(y_s,y_t) - k(x_s,y_t) - k(y_s,x_t).
- unbiased / U-statistic (Gretton et al. 2012 JMLR, Eq. 3; any n, m >= 2):
      MMD_u^2 = sum_{i!=j} K_xx/(n(n-1)) + sum_{i!=j} K_yy/(m(m-1)) - 2 mean(K_xy).
- paired unbiased (Liu et al. 2020, Eq. 2; n = m, used by MMD-D):
      MMD_u^2 = sum_{i!=j} H_ij / (n(n-1)),  H = K_xx + K_yy - K_xy - K_xy^T.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from fedhet.losses.kernels import gaussian_kernel, median_heuristic_sigma

Estimator = Literal["biased", "unbiased"]


def _off_diag_sum(k: Tensor) -> Tensor:
    return k.sum(dim=(-2, -1)) - k.diagonal(dim1=-2, dim2=-1).sum(dim=-1)


def mmd2_biased(k_xx: Tensor, k_yy: Tensor, k_xy: Tensor) -> Tensor:
    """Biased V-statistic MMD_b^2 (Gretton et al. 2012, Eq. 5); >= 0 for a PSD kernel."""
    return k_xx.mean(dim=(-2, -1)) + k_yy.mean(dim=(-2, -1)) - 2.0 * k_xy.mean(dim=(-2, -1))


def mmd2_unbiased(k_xx: Tensor, k_yy: Tensor, k_xy: Tensor) -> Tensor:
    """Unbiased U-statistic MMD_u^2 (Gretton et al. 2012, Eq. 3); needs n, m >= 2; may be negative."""
    n, m = k_xx.shape[-1], k_yy.shape[-1]
    if n < 2 or m < 2:
        raise ValueError(f"the unbiased MMD needs at least 2 samples on each side, got n={n}, m={m}")
    return _off_diag_sum(k_xx) / (n * (n - 1)) + _off_diag_sum(k_yy) / (m * (m - 1)) - 2.0 * k_xy.mean(dim=(-2, -1))


def h_matrix(k_xx: Tensor, k_yy: Tensor, k_xy: Tensor) -> Tensor:
    """H_st = k(x_s,x_t) + k(y_s,y_t) - k(x_s,y_t) - k(y_s,x_t) for paired samples (n = m)."""
    if k_xx.shape[-1] != k_yy.shape[-1]:
        raise ValueError(f"h needs paired samples of equal size, got n={k_xx.shape[-1]}, m={k_yy.shape[-1]}")
    return k_xx + k_yy - k_xy - k_xy.transpose(-2, -1)


def mmd2_unbiased_paired(k_xx: Tensor, k_yy: Tensor, k_xy: Tensor) -> Tensor:
    """Paired U-statistic of Liu et al. 2020, Eq. 2: off-diagonal mean of H (n = m >= 2)."""
    h = h_matrix(k_xx, k_yy, k_xy)
    n = h.shape[-1]
    if n < 2:
        raise ValueError(f"the unbiased MMD needs at least 2 samples, got n={n}")
    return _off_diag_sum(h) / (n * (n - 1))


def gaussian_mmd(x: Tensor, y: Tensor, sigma: float | Tensor | None = None, estimator: Estimator = "biased") -> Tensor:
    """MMD^2 between x (n, d) and y (m, d) with k(a,b) = exp(-||a-b||^2 / (2 sigma^2)) (FRAug Eqs. 5-6).

    `sigma=None` uses the median heuristic on the pooled sample (bandwidth detached). The default is the biased
    V-statistic: it is >= 0 and defined for m = 1 (FRAug's MMD against a single class prototype).
    Inputs of more than 2 dims are flattened to (batch, -1).
    """
    x, y = x.flatten(1), y.flatten(1)
    s = median_heuristic_sigma(x, y) if sigma is None else torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
    k_xx, k_yy, k_xy = gaussian_kernel(x, x, s), gaussian_kernel(y, y, s), gaussian_kernel(x, y, s)
    if estimator == "biased":
        return mmd2_biased(k_xx, k_yy, k_xy)
    if estimator == "unbiased":
        return mmd2_unbiased(k_xx, k_yy, k_xy)
    raise ValueError(f"unknown MMD estimator '{estimator}'; valid: biased, unbiased")
