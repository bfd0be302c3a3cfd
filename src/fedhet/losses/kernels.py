"""Gaussian (RBF) kernel matrices and the median-heuristic bandwidth.

One kernel family, two parametrisations (both appear in the papers; gamma = 2 sigma^2):

    gaussian_kernel(x, y, sigma):  k(a, b) = exp(-||a - b||^2 / (2 sigma^2))   (Gretton et al. 2012 JMLR; FRAug MMD)
    rbf_kernel(x, y, gamma):       k(a, b) = exp(-||a - b||^2 / gamma)         (Ditto-MMD MK-MMD basis, gamma = 2^e)

Note the MK-MMD `gamma` *divides* the squared distance (spec ditto_mmd.md §2.3, FL4Health form); it is not the
"exp(-gamma ||a - b||^2)" convention. All functions are differentiable in torch (no square roots on the
gradient path, so zero distances are safe).
"""

from __future__ import annotations

import torch
from torch import Tensor


def pairwise_sq_dists(x: Tensor, y: Tensor) -> Tensor:
    """(n, m) matrix of ||x_i - y_j||^2 for x (n, d), y (m, d), clamped at 0 against round-off."""
    x2 = (x * x).sum(dim=1, keepdim=True)
    y2 = (y * y).sum(dim=1).unsqueeze(0)
    return (x2 + y2 - 2.0 * x @ y.T).clamp_min(0.0)


def rbf_kernel(x: Tensor, y: Tensor, gamma: float | Tensor) -> Tensor:
    """exp(-||x_i - y_j||^2 / gamma); a 1-d `gamma` of K scales gives a (K, n, m) stack, a scalar an (n, m) matrix."""
    d2 = pairwise_sq_dists(x, y)
    g = torch.as_tensor(gamma, dtype=d2.dtype, device=d2.device)
    if g.dim() == 0:
        return torch.exp(-d2 / g)
    return torch.exp(-d2.unsqueeze(0) / g.reshape(-1, 1, 1))


def gaussian_kernel(x: Tensor, y: Tensor, sigma: float | Tensor) -> Tensor:
    """exp(-||x_i - y_j||^2 / (2 sigma^2)), i.e. `rbf_kernel` with gamma = 2 sigma^2 (1-d `sigma` gives a stack)."""
    s = torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
    return rbf_kernel(x, y, 2.0 * s * s)


def median_heuristic_sigma(x: Tensor, y: Tensor) -> Tensor:
    """Median Euclidean distance between distinct points of the pooled sample [x; y] (Gretton et al. 2012, §8).

    Computed without gradient (the bandwidth is a constant of the loss). An even number of pairs gives the mean
    of the two middle distances (numpy's convention). Returns 1.0 when all pooled points coincide.
    """
    with torch.no_grad():
        z = torch.cat([x, y], dim=0)
        n = z.shape[0]
        if n < 2:
            return torch.ones((), dtype=z.dtype, device=z.device)
        iu = torch.triu_indices(n, n, offset=1, device=z.device)
        dist = pairwise_sq_dists(z, z)[iu[0], iu[1]].sqrt().sort().values
        k = dist.numel()
        med = dist[k // 2] if k % 2 == 1 else 0.5 * (dist[k // 2 - 1] + dist[k // 2])
        return med if bool(med > 0) else torch.ones((), dtype=z.dtype, device=z.device)
