"""Set distances between feature batches used by FRAug's official code (HaokunChen245/FRAug, utils/loss_utils.py).

- `mean_cov_distance`: mean((mu_x - mu_y)^2) + mean((C_x - C_y)^2), C the unbiased covariance (loss_utils.py:66-77;
  the official `MMD_loss()` default, kernel_type 'mean_cov').
- `multi_kernel_mmd`: biased MMD^2 summed over `kernels` Gaussian kernels exp(-||a - b||^2 / b_i),
  b_i = b_0 mul^i, b_0 = (mean pairwise squared distance of the pooled sample, detached) / mul^(kernels // 2)
  (loss_utils.py:50-64, 79-87; the official 'MMD_kernel').
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.losses.kernels import pairwise_sq_dists, rbf_kernel
from fedhet.losses.mmd import mmd2_biased


def mean_cov_distance(x: Tensor, y: Tensor) -> Tensor:
    """Squared distance of the means plus squared distance of the covariances, each averaged over entries.
    One sample on a side has covariance 0 (the official code divides by n - 1 = 0 there; we guard it)."""
    mx, my = x.mean(0, keepdim=True), y.mean(0, keepdim=True)
    cx = (x - mx).T @ (x - mx) / max(len(x) - 1, 1)
    cy = (y - my).T @ (y - my) / max(len(y) - 1, 1)
    return (mx - my).pow(2).mean() + (cx - cy).pow(2).mean()


def multi_kernel_bandwidths(x: Tensor, y: Tensor, kernels: int = 5, mul: float = 2.0) -> Tensor:
    """The `kernels` divisors b_i of the squared distance: the pooled sample's mean off-diagonal squared distance,
    divided by mul^(kernels // 2), times mul^i (no gradient)."""
    with torch.no_grad():
        z = torch.cat([x, y])
        n = len(z)
        base = pairwise_sq_dists(z, z).sum() / max(n * n - n, 1)
        base = base.clamp_min(1e-12) / mul ** (kernels // 2)
        return base * mul ** torch.arange(kernels, dtype=z.dtype, device=z.device)


def multi_kernel_mmd(x: Tensor, y: Tensor, kernels: int = 5, mul: float = 2.0) -> Tensor:
    """Biased MMD^2 with the sum of `kernels` Gaussian kernels (the official 'MMD_kernel')."""
    b = multi_kernel_bandwidths(x, y, kernels, mul)
    return mmd2_biased(rbf_kernel(x, x, b), rbf_kernel(y, y, b), rbf_kernel(x, y, b)).sum()
