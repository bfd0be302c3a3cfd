"""MK-MMD kernel-weight selection (Gretton et al. 2012 NeurIPS, "Optimal kernel choice"; Ditto-MMD §3.3, Eq. 1).

Per-kernel full quadratic statistics on paired samples x, y (n x d each), h_u as in `fedhet.losses.mmd.h_matrix`:

    d_u   = (1/n^2)      sum_{s,t} h_u(s,t)                                  (all n x n pairs, diagonal included)
    Q_uv  = (1/(n^2-1))  sum_{s,t} (h_u(s,t) - d_u)(h_v(s,t) - d_v)          (ditto_mmd.md §2.3, FL4Health form)

and the test-power QP (Eq. 1 approximated):  min_beta beta^T (Q + lambda_m I) beta  s.t.  beta^T d = 1, beta >= 0.

The QP is solved exactly as a least-distance program via NNLS (Lawson & Hanson 1974, Ch. 23): with
Q + lambda_m I = L L^T and z = L^T beta it is  min ||z||  s.t.  G z >= h,  G = [L^-T; d^T L^-T], h = [0; 1]
(the equality may be relaxed to beta^T d >= 1 because the objective is 2-homogeneous: it is tight at the optimum),
then polished on the active set: beta_S = A_SS^-1 d_S / (d_S^T A_SS^-1 d_S), zero elsewhere, if that satisfies KKT.

lambda_m: the spec's QP form beta^T (Q + lambda_m I) beta with lambda_m = 1e-5. FL4Health passes 2Q + lambda_m I to
a solver of (1/2) beta^T P beta, i.e. an effective lambda_m / 2; pass lambda_m=5e-6 to reproduce the code exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.optimize
import torch
from torch import Tensor

from fedhet.losses.kernels import pairwise_sq_dists

DEFAULT_LAMBDA_M = 1e-5


class BetaQPError(ValueError):
    """The beta QP could not be solved (infeasible or numerically broken)."""


def _squaring_plan(gammas: Tensor) -> list[tuple[int, int]]:
    """(u, parent) for every kernel u, largest gamma first, parent = the index of the kernel with twice u's
    bandwidth (-1: none), so that exp(-D / gamma_u) = exp(-D / (2 gamma_u))^2 replaces an exp by a square (the 19
    default kernels step by 2^0.25: 4 exps, 15 squares). In this order every parent is filled before its child."""
    g = gammas.tolist()
    order = sorted(range(len(g)), key=lambda i: -g[i])
    return [(u, next((v for v, gv in enumerate(g) if abs(gv - 2.0 * g[u]) <= 1e-12 * gv), -1)) for u in order]


def _gaussian_stack(dists: Tensor, gammas: Tensor, plan: list[tuple[int, int]]) -> Tensor:
    """exp(-dists / gamma_u) for every kernel u: (K, *dists.shape); squares along `plan` where it can."""
    out = torch.empty((len(plan), *dists.shape), dtype=dists.dtype, device=dists.device)
    for u, parent in plan:
        if parent < 0:
            torch.exp(dists / -gammas[u], out=out[u])
        else:
            torch.mul(out[parent], out[parent], out=out[u])
    return out


def _h_upper_blocks(x: Tensor, y: Tensor, gammas: Tensor, block_rows: int) -> Iterator[tuple[Tensor, Tensor]]:
    """The upper triangle of the symmetric pair grid h_u(s, t) in row blocks: for rows s of one block, the
    diagonal square (K, b, b) and the columns to its right (K, b, n - a - b), which stand for their mirror too."""
    plan = _squaring_plan(gammas)
    n = x.shape[0]
    for a in range(0, n, block_rows):
        b = min(block_rows, n - a)
        xs, ys, xc, yc = x[a : a + b], y[a : a + b], x[a:], y[a:]
        dists = torch.stack([pairwise_sq_dists(xs, xc), pairwise_sq_dists(ys, yc),
                             pairwise_sq_dists(xs, yc), pairwise_sq_dists(ys, xc)])
        k = _gaussian_stack(dists, gammas, plan)  # (K, 4, b, n - a)
        h = k[:, 0] + k[:, 1] - k[:, 2] - k[:, 3]
        yield h[:, :, :b], h[:, :, b:]


def mk_mmd_statistics(x: Tensor, y: Tensor, gammas: Tensor, max_block_elems: int = 2**22) -> tuple[Tensor, Tensor]:
    """(d, Q): per-kernel full quadratic MMD^2 estimates (K,) and their covariance (K, K), in float64, no grad.

    x, y: paired samples (n, d), n >= 2 (features are used as given: normalise before calling if wanted).
    h_u(s, t) = h_u(t, s), so only the upper triangle of the n x n pair grid is computed (off-diagonal entries
    count twice): about half the work of the full grid. Memory is bounded by row blocks of about
    `max_block_elems` values (and at most max(n / 16, 64) rows: the triangle saves work on large n, one block
    saves Python overhead on the small per-step batches of refit_interval -1).
    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"MK-MMD needs paired 2-d samples of equal shape, got {tuple(x.shape)}, {tuple(y.shape)}")
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"MK-MMD statistics need at least 2 samples, got {n}")
    with torch.no_grad():
        x, y = x.detach().double(), y.detach().double()
        g = gammas.detach().to(device=x.device, dtype=torch.float64)
        k = g.numel()
        rows = max(1, min(max_block_elems // (5 * k * n), max(-(-n // 16), 64)))
        total = torch.zeros(k, dtype=torch.float64, device=x.device)
        second = torch.zeros(k, k, dtype=torch.float64, device=x.device)
        for diag, right in _h_upper_blocks(x, y, g, rows):  # one pass: sums and raw second moments (h = O(1))
            total += diag.sum(dim=(1, 2)) + 2.0 * right.sum(dim=(1, 2))
            flat_d, flat_r = diag.reshape(k, -1), right.reshape(k, -1)
            second += flat_d @ flat_d.T + 2.0 * (flat_r @ flat_r.T)
        d = total / (n * n)
        q = second - (n * n) * torch.outer(d, d)
        q /= n * n - 1.0
    return d, q


def _ldp_beta(a: np.ndarray, d: np.ndarray) -> np.ndarray:
    """min beta^T A beta s.t. d^T beta >= 1, beta >= 0 as a least-distance program solved by NNLS."""
    k = d.size
    try:
        chol = np.linalg.cholesky(a)
        l_inv_t = scipy.linalg.solve_triangular(chol, np.eye(k), lower=True).T  # L^-T
    except np.linalg.LinAlgError as e:
        raise BetaQPError(f"beta QP: Q + lambda_m I is not positive definite ({e})") from e
    g = np.vstack([l_inv_t, d @ l_inv_t])  # (K+1, K): constraints G z >= h
    h = np.zeros(k + 1)
    h[-1] = 1.0
    e_mat = np.vstack([g.T, h])  # (K+1, K+1): E of LDP -> NNLS (Lawson & Hanson, Alg. 23.27)
    u, _ = scipy.optimize.nnls(e_mat, h, maxiter=50 * (k + 1))
    r = e_mat @ u - h
    if not np.all(np.isfinite(r)) or abs(r[-1]) < 1e-14:
        raise BetaQPError("beta QP: least-distance program reported infeasible")
    return np.asarray(l_inv_t @ (-r[:k] / r[-1]))


def _polish(a: np.ndarray, d: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Re-solve the KKT system on the support of `beta` (exact zeros off it); keep `beta` if that fails KKT."""
    s = beta > 1e-10 * beta.max()
    if not np.any(d[s] > 0):
        return beta
    try:
        w = np.linalg.solve(a[np.ix_(s, s)], d[s])
    except np.linalg.LinAlgError:
        return beta
    out = np.zeros_like(beta)
    out[s] = w / (d[s] @ w)
    grad = a @ out - (out @ a @ out) * d  # KKT: >= 0 everywhere, = 0 on the support
    if np.all(out[s] > 0) and np.all(grad >= -1e-9 * np.abs(a @ out).max()):
        return out
    return beta


def solve_beta_qp(d: np.ndarray, q: np.ndarray, lambda_m: float = DEFAULT_LAMBDA_M) -> np.ndarray:
    """Exact minimiser of beta^T (Q + lambda_m I) beta s.t. beta^T d = 1, beta >= 0 (not normalised).

    Solved on a rescaled problem (d / max|d|, A / max diag A; the minimiser only rescales) by the NNLS-based
    least-distance program, then polished by an equality-constrained solve on the found support.
    Raises BetaQPError when no entry of d is positive (infeasible) or the solve breaks down numerically.
    """
    d = np.asarray(d, dtype=np.float64).reshape(-1)
    q = np.asarray(q, dtype=np.float64)
    if not np.all(np.isfinite(d)) or not np.all(np.isfinite(q)):
        raise BetaQPError("beta QP: non-finite d or Q")
    if not np.any(d > 0):
        raise BetaQPError("beta QP infeasible: no positive entry in d")
    a = 0.5 * (q + q.T) + lambda_m * np.eye(d.size)
    d_scale = np.abs(d).max()
    dn, an = d / d_scale, a / np.diag(a).max()
    beta = _polish(an, dn, _ldp_beta(an, dn)) / d_scale
    if not np.all(np.isfinite(beta)):
        raise BetaQPError("beta QP: non-finite solution")
    return np.asarray(beta)


def fallback_beta(d: np.ndarray, q: np.ndarray, lambda_m: float = DEFAULT_LAMBDA_M) -> np.ndarray:
    """One-hot beta on argmax_u d_u / (Q_uu + lambda_m): Gretton et al.'s single-kernel choice when no d_u > 0."""
    d = np.asarray(d, dtype=np.float64).reshape(-1)
    ratio = d / (np.diag(np.asarray(q, dtype=np.float64)) + lambda_m)
    beta = np.zeros_like(d)
    beta[int(np.argmax(ratio))] = 1.0
    return beta


@dataclass(frozen=True)
class BetaFit:
    """Outcome of one weight fit. `beta` is what MK-MMD uses (>= 0, sums to 1).

    method: "qp" (QP solved; `raw_beta` is its solution, beta^T d = 1), "fallback" (no d_u > 0: one-hot),
    "kept" (QP failed: previous beta kept) or "fixed" (weights not learned).
    """

    beta: Tensor
    method: str
    d: Tensor | None = None
    q: Tensor | None = None
    raw_beta: Tensor | None = None


def _as_tensor(a: np.ndarray) -> Tensor:
    return torch.as_tensor(a, dtype=torch.float64)


def fit_beta(d: Tensor, q: Tensor, previous: Tensor, lambda_m: float = DEFAULT_LAMBDA_M) -> BetaFit:
    """Spec §2.3 update: QP, clamp at 0, renormalise to sum 1; one-hot fallback if no d_u > 0; keep on failure."""
    dn, qn = d.detach().cpu().double().numpy(), q.detach().cpu().double().numpy()
    if not np.any(dn > 0):
        return BetaFit(_as_tensor(fallback_beta(dn, qn, lambda_m)), "fallback", d, q)
    try:
        raw = solve_beta_qp(dn, qn, lambda_m)
    except BetaQPError:
        return BetaFit(previous.detach().double().cpu().clone(), "kept", d, q)
    clamped = np.clip(raw, 0.0, None)
    total = clamped.sum()
    if not np.isfinite(total) or total <= 0:
        return BetaFit(previous.detach().double().cpu().clone(), "kept", d, q)
    return BetaFit(_as_tensor(clamped / total), "qp", d, q, _as_tensor(raw))
