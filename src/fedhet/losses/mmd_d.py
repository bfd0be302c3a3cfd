"""MMD-D deep-kernel MMD (Liu et al. 2020, ICML; Ditto-MMD §3.4, Eqs. 2-3; spec ditto_mmd.md §2.4).

Kernel (Eq. 2):  k(x, y) = [(1 - eps) kappa(phi(x), phi(y)) + eps] q(x, y),
                 kappa(a, b) = exp(-||a - b||^2 / sigma_phi),  q(x, y) = exp(-||x - y||^2 / sigma_q),
with eps = sigmoid(eps_raw), sigma_phi = s_phi^2, sigma_q = s_q^2 and phi an MLP, all trained together.
Statistic: paired U-statistic MMD_u^2 (Liu Eq. 2); variance (Liu Eq. 5, regularised):
    sigma^2 = (4/n^3) ||H 1||^2 - (4/n^4) (1^T H 1)^2 + lambda,   H = K_xx + K_yy - K_xy - K_xy^T.
Kernel training maximises MMD_u^2 / sigma (Eq. 3) with AdamW; the y-sample is shuffled before each step.
As a penalty, MMD_u^2 is computed with the kernel parameters detached: gradients reach x and y only.

Defaults are FL4Health's (spec [C]): phi = Linear(d,10)-Softplus-Linear(10,10)-Softplus-Linear(10,10)-Softplus-
Linear(10,50); s_q = sqrt(2*32*32); s_phi = sqrt(0.005); eps_raw = log(U(0,1) * 1e-10); lambda = 1e-8;
AdamW lr 1e-3 with torch's default weight decay (0.01, applied to all kernel parameters, as in the code).
The AdamW state is held on the object (created at the first `train_steps`; not in `state_dict`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedhet.losses.descent import descend
from fedhet.losses.kernels import pairwise_sq_dists
from fedhet.losses.mmd import h_matrix, mmd2_unbiased_paired

DEFAULT_VARIANCE_REG = 1e-8


class DeepKernelFeaturizer(nn.Module):
    """phi: Linear-Softplus x3 then Linear (hidden 10, out 50 by default)."""

    def __init__(self, in_features: int, hidden_features: int = 10, out_features: int = 50) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden_features),
            nn.Softplus(),
            nn.Linear(hidden_features, hidden_features),
            nn.Softplus(),
            nn.Linear(hidden_features, hidden_features),
            nn.Softplus(),
            nn.Linear(hidden_features, out_features),
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)  # nn.Module calls are untyped in torch
        return out


def mmd_variance(h: Tensor, reg: float = DEFAULT_VARIANCE_REG) -> Tensor:
    """Regularised variance estimate of Liu et al. 2020, Eq. 5, from the (n, n) H matrix."""
    n = h.shape[-1]
    row = h.sum(dim=-1)
    return 4.0 / n**3 * (row * row).sum() - 4.0 / n**4 * h.sum() ** 2 + reg


class MMDD(nn.Module):
    """Deep-kernel MMD: `train_steps(x, y, n)` fits the kernel; `mmd(x, y)` is the penalty MMD_u^2 (n = m)."""

    def __init__(
        self,
        in_features: int,
        *,
        hidden_features: int = 10,
        out_features: int = 50,
        lr: float = 1e-3,
        sigma_q_init: float = 2.0 * 32 * 32,
        sigma_phi_init: float = 0.005,
        variance_reg: float = DEFAULT_VARIANCE_REG,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.featurizer = DeepKernelFeaturizer(in_features, hidden_features, out_features).to(dtype)
        u = torch.rand(1, generator=generator, dtype=torch.float64).clamp_min(1e-300)
        self.eps_raw = nn.Parameter(torch.log(u * 1e-10).to(dtype))
        self.s_q = nn.Parameter(torch.full((1,), math.sqrt(sigma_q_init), dtype=dtype))
        self.s_phi = nn.Parameter(torch.full((1,), math.sqrt(sigma_phi_init), dtype=dtype))
        self.variance_reg = variance_reg
        self.generator = generator
        self.lr = lr
        self.optimizer: torch.optim.Optimizer | None = None  # created on the first train_steps (after any .to())

    def _kernel_matrices(self, x: Tensor, y: Tensor, frozen: bool) -> tuple[Tensor, Tensor, Tensor]:
        x, y = x.flatten(1).to(self.s_q.dtype), y.flatten(1).to(self.s_q.dtype)
        if x.shape != y.shape:
            raise ValueError(f"MMD-D needs paired samples of equal shape, got {tuple(x.shape)}, {tuple(y.shape)}")
        if x.shape[0] < 2:
            raise ValueError(f"MMD-D needs at least 2 samples, got {x.shape[0]}")
        z = torch.cat([x, y], dim=0)
        if frozen:
            params = {k: v.detach() for k, v in self.featurizer.named_parameters()}
            phi = functional_call(self.featurizer, params, (z,))
            eps_raw, s_q, s_phi = self.eps_raw.detach(), self.s_q.detach(), self.s_phi.detach()
        else:
            phi = self.featurizer(z)
            eps_raw, s_q, s_phi = self.eps_raw, self.s_q, self.s_phi
        eps, sigma_q, sigma_phi = torch.sigmoid(eps_raw), s_q * s_q, s_phi * s_phi
        n = x.shape[0]
        px, py = phi[:n], phi[n:]

        def k(a: Tensor, b: Tensor, fa: Tensor, fb: Tensor) -> Tensor:
            kappa = torch.exp(-pairwise_sq_dists(fa, fb) / sigma_phi)
            return ((1.0 - eps) * kappa + eps) * torch.exp(-pairwise_sq_dists(a, b) / sigma_q)

        return k(x, x, px, px), k(y, y, py, py), k(x, y, px, py)

    def mmd2_and_variance(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(MMD_u^2, regularised variance), differentiable w.r.t. the kernel parameters (and x, y)."""
        k_xx, k_yy, k_xy = self._kernel_matrices(x, y, frozen=False)
        return mmd2_unbiased_paired(k_xx, k_yy, k_xy), mmd_variance(h_matrix(k_xx, k_yy, k_xy), self.variance_reg)

    def objective(self, x: Tensor, y: Tensor) -> Tensor:
        """Test-power criterion J = MMD_u^2 / sigma (Liu Eq. 4 / Ditto-MMD Eq. 3), to be maximised."""
        mmd2, var = self.mmd2_and_variance(x, y)
        return mmd2 / torch.sqrt(var)

    def train_steps(self, x: Tensor, y: Tensor, n_steps: int) -> list[float]:
        """n_steps AdamW steps maximising J on detached x, y (y reshuffled each step); returns J before each step."""
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr)
        x, y = x.detach(), y.detach()
        history: list[float] = []
        for _ in range(n_steps):
            perm = torch.randperm(y.shape[0], generator=self.generator).to(y.device)
            j = self.objective(x, y[perm])
            descend(self.optimizer, -j, "MMD-D's kernel training", "lower method_args.kernel_lr")
            history.append(float(j.detach()))
        return history

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Penalty MMD_u^2 (Liu Eq. 2) with the kernel frozen: gradients flow to x and y only."""
        return mmd2_unbiased_paired(*self._kernel_matrices(x, y, frozen=True))
