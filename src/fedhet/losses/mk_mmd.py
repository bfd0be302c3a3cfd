"""MK-MMD feature penalty of Ditto-MMD (Ayromlou & Emerson 2025, §3.3; spec ditto_mmd.md §2.3).

    MK-MMD(x, y) = sum_u beta_u d_u,   k_u(a, b) = exp(-||a - b||^2 / gamma_u),   gamma_u = 2^e, e = -3.5, ..., 1
                                                                                  (step 0.25: 19 kernels)

with d_u the full quadratic (V-statistic) MMD^2 of kernel u on unit-L2-normalised features and beta >= 0,
sum beta = 1, fitted by the test-power QP of `fedhet.losses.mk_mmd_weights` (Gretton et al. 2012, Eq. 1).

Choices where the spec leaves room:
- beta starts uniform (1/K), not random as in FL4Health; callers fit before first use anyway (§2.3 schedules).
- Features are normalised with F.normalize (eps 1e-12), so an all-zero (post-ReLU) feature row gives zeros, not NaN.
- The loss value may be taken on unpaired samples (n != m: mean Kxx + mean Kyy - 2 mean Kxy); fitting needs n = m.
- Fitting runs in float64 without gradient; the loss is differentiable w.r.t. x and y (beta is a constant).
- Fallback (no d_u > 0): one-hot on argmax_u d_u / (Q_uu + lambda_m) (spec: d_u / Q_uu; the lambda_m guards
  Q_uu = 0). The full quadratic d_u is a V-statistic, hence >= 0, so this happens only when d = 0, e.g. x == y
  (round 1, step 0 of Ditto, when local and global features coincide); ties pick the first (smallest) gamma.
- QP failure keeps the previous beta (`BetaFit.method == "kept"`), as FL4Health does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.losses.kernels import rbf_kernel
from fedhet.losses.mk_mmd_weights import DEFAULT_LAMBDA_M, BetaFit, fit_beta, mk_mmd_statistics
from fedhet.losses.mmd import mmd2_biased

MKMMD_EXPONENTS: tuple[float, ...] = tuple(-3.5 + 0.25 * i for i in range(19))


def default_gammas(n_kernels: int = len(MKMMD_EXPONENTS)) -> Tensor:
    """gamma_u = 2^e for the first `n_kernels` exponents e = -3.5, -3.25, ..., 1.0 (float64)."""
    if not 1 <= n_kernels <= len(MKMMD_EXPONENTS):
        raise ValueError(f"n_kernels must be in 1..{len(MKMMD_EXPONENTS)}, got {n_kernels}")
    return torch.pow(2.0, torch.tensor(MKMMD_EXPONENTS[:n_kernels], dtype=torch.float64))


class MKMMD(nn.Module):
    """Multi-kernel MMD with test-power-optimal kernel weights (state: buffers `gammas`, `beta`).

    `mmd(x, y)` is the weighted MMD^2 (differentiable); `mmd.fit_weights(x, y)` re-fits beta on the given
    (possibly accumulated) paired samples. `learn_weights=False` freezes beta (fixed-kernel ablation).
    """

    gammas: Tensor
    beta: Tensor

    def __init__(
        self,
        gammas: Sequence[float] | Tensor | None = None,
        *,
        beta: Sequence[float] | Tensor | None = None,
        normalize_features: bool = True,
        lambda_m: float = DEFAULT_LAMBDA_M,
        learn_weights: bool = True,
    ) -> None:
        super().__init__()
        g = default_gammas() if gammas is None else torch.as_tensor(gammas, dtype=torch.float64).reshape(-1)
        k = g.numel()
        b = torch.full((k,), 1.0 / k, dtype=torch.float64) if beta is None else torch.as_tensor(beta).double()
        if b.shape != (k,) or bool((b < 0).any()) or abs(float(b.sum()) - 1.0) > 1e-6:
            raise ValueError(f"beta must be {k} non-negative weights summing to 1, got {b.tolist()}")
        self.register_buffer("gammas", g)
        self.register_buffer("beta", b)
        self.normalize_features = normalize_features
        self.lambda_m = lambda_m
        self.learn_weights = learn_weights
        self.last_fit: BetaFit | None = None

    @classmethod
    def fixed_uniform(cls, n_kernels: int, *, normalize_features: bool = True) -> MKMMD:
        """Ablation (paper §6.2 / Fig. 3 right): the first n of the 19 kernels, fixed weights 1/n."""
        return cls(default_gammas(n_kernels), normalize_features=normalize_features, learn_weights=False)

    def _prepare(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        return F.normalize(x, dim=1) if self.normalize_features else x

    def kernel_estimates(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-kernel full quadratic MMD^2 estimates d_u (K,), differentiable, in the inputs' dtype."""
        x, y = self._prepare(x), self._prepare(y)
        g = self.gammas.to(dtype=x.dtype)
        return mmd2_biased(rbf_kernel(x, x, g), rbf_kernel(y, y, g), rbf_kernel(x, y, g))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Weighted MMD^2 = beta^T d between x (n, ...) and y (m, ...); gradient flows to x and y, not beta."""
        d = self.kernel_estimates(x, y)
        return (self.beta.to(dtype=d.dtype) * d).sum()

    def statistics(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(d, Q) on the (normalised) paired samples, float64, no grad."""
        with torch.no_grad():
            return mk_mmd_statistics(self._prepare(x.detach()), self._prepare(y.detach()), self.gammas)

    def fit_weights(self, x: Tensor, y: Tensor) -> BetaFit:
        """Re-fit beta on paired samples x, y (n, ...) by the test-power QP; returns the fit (also `last_fit`)."""
        if not self.learn_weights:
            fit = BetaFit(self.beta.detach().clone(), "fixed")
        else:
            d, q = self.statistics(x, y)
            fit = fit_beta(d, q, self.beta, self.lambda_m)
            self.beta.copy_(fit.beta.to(self.beta))
        self.last_fit = fit
        return fit
