"""Feature-space losses: Gaussian MMD (FRAug), MK-MMD and MMD-D (Ditto-MMD), cosine penalty, softmax entropy."""

from fedhet.losses.entropy import softmax_entropy
from fedhet.losses.kernels import gaussian_kernel, median_heuristic_sigma, pairwise_sq_dists, rbf_kernel
from fedhet.losses.mk_mmd import MKMMD, MKMMD_EXPONENTS, default_gammas
from fedhet.losses.mk_mmd_weights import (
    BetaFit,
    BetaQPError,
    fallback_beta,
    fit_beta,
    mk_mmd_statistics,
    solve_beta_qp,
)
from fedhet.losses.mmd import gaussian_mmd, h_matrix, mmd2_biased, mmd2_unbiased, mmd2_unbiased_paired
from fedhet.losses.mmd_d import MMDD, DeepKernelFeaturizer, mmd_variance
from fedhet.losses.schedule import KernelWeightSchedule
from fedhet.losses.similarity import cosine_similarity_penalty

__all__ = [
    "MKMMD",
    "MKMMD_EXPONENTS",
    "MMDD",
    "BetaFit",
    "BetaQPError",
    "DeepKernelFeaturizer",
    "KernelWeightSchedule",
    "cosine_similarity_penalty",
    "default_gammas",
    "fallback_beta",
    "fit_beta",
    "gaussian_kernel",
    "gaussian_mmd",
    "h_matrix",
    "median_heuristic_sigma",
    "mk_mmd_statistics",
    "mmd2_biased",
    "mmd2_unbiased",
    "mmd2_unbiased_paired",
    "mmd_variance",
    "pairwise_sq_dists",
    "rbf_kernel",
    "softmax_entropy",
    "solve_beta_qp",
]
