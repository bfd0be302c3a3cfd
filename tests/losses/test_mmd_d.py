"""MMD-D deep kernel: statistic and variance against numpy, kernel training, frozen-kernel penalty."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedhet.losses import MMDD


def _pair(seed: int, n: int = 16, dim: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    y = 1.5 * torch.randn(n, dim, generator=g, dtype=torch.float64) + 0.5
    return x, y


def _mmdd(seed: int = 0, dim: int = 3) -> MMDD:
    torch.manual_seed(seed)
    return MMDD(dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_init_follows_spec() -> None:
    m = _mmdd()
    assert float(m.s_q.detach()) ** 2 == pytest.approx(2 * 32 * 32) and float(m.s_phi.detach()) ** 2 == pytest.approx(
        0.005
    )
    assert 0.0 < float(torch.sigmoid(m.eps_raw.detach())) < 1e-10
    sizes = [tuple(p.shape) for p in m.featurizer.parameters()]
    assert sizes == [(10, 3), (10,), (10, 10), (10,), (10, 10), (10,), (50, 10), (50,)]


def test_statistic_and_variance_match_numpy() -> None:
    x, y = _pair(0)
    m = _mmdd()
    m.s_phi.data.fill_(1.0)  # a bandwidth where kappa is not ~ the identity, so every term matters
    m.s_q.data.fill_(3.0)
    m.eps_raw.data.fill_(-1.0)
    with torch.no_grad():
        px, py = m.featurizer(x).numpy(), m.featurizer(y).numpy()
    eps, sq, sphi = 1 / (1 + math.e), 9.0, 1.0
    xn, yn, n = x.numpy(), y.numpy(), len(x)

    def k(a, b, fa, fb) -> float:
        return ((1 - eps) * np.exp(-np.sum((fa - fb) ** 2) / sphi) + eps) * np.exp(-np.sum((a - b) ** 2) / sq)

    hm = np.array(
        [
            [
                k(xn[i], xn[j], px[i], px[j])
                + k(yn[i], yn[j], py[i], py[j])
                - k(xn[i], yn[j], px[i], py[j])
                - k(xn[j], yn[i], px[j], py[i])
                for j in range(n)
            ]
            for i in range(n)
        ]
    )
    mmd2_ref = (hm.sum() - np.trace(hm)) / (n * (n - 1))
    var_ref = 4 / n**3 * np.sum(hm.sum(1) ** 2) - 4 / n**4 * hm.sum() ** 2 + 1e-8
    mmd2, var = (t.detach() for t in m.mmd2_and_variance(x, y))
    assert float(mmd2) == pytest.approx(mmd2_ref, rel=1e-10)
    assert float(var) == pytest.approx(var_ref, rel=1e-10)
    assert float(m.objective(x, y).detach()) == pytest.approx(mmd2_ref / math.sqrt(var_ref), rel=1e-10)
    assert float(m(x, y)) == pytest.approx(mmd2_ref, rel=1e-10)


def test_training_increases_objective() -> None:
    x, y = _pair(1, n=24)
    m = _mmdd(1)
    before = float(m.objective(x, y).detach())
    hist = m.train_steps(x, y, 30)
    after = float(m.objective(x, y).detach())
    assert len(hist) == 30 and all(math.isfinite(h) for h in hist)
    assert after > before
    assert m.optimizer is not None and m.optimizer.param_groups[0]["lr"] == 1e-3


def test_penalty_gradient_reaches_features_only() -> None:
    x, y = _pair(2)
    m = _mmdd(2)
    m.train_steps(x, y, 2)
    m.zero_grad(set_to_none=True)
    xr = x.clone().requires_grad_(True)
    val = m(xr, y)
    val.backward()
    assert torch.isfinite(xr.grad).all() and xr.grad.abs().sum() > 0
    assert all(p.grad is None for p in m.parameters())
    with pytest.raises(ValueError):
        m(x[:5], y)
    with pytest.raises(ValueError):
        m(x[:1], y[:1])
