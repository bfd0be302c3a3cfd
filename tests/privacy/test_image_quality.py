"""PSNR and SSIM (Wang et al. 2004) by hand, against scipy's Gaussian filter, and the best match per true image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from fedhet.privacy.image_quality import best_matches, psnr, ssim, unit_range, window_side


def test_psnr_by_hand() -> None:
    zeros = torch.zeros(2, 1, 2, 2)
    other = zeros.clone()
    other[0] += 0.1  # every pixel off by 0.1: MSE 0.01 -> 20 dB
    other[1, 0, 0, 0] = 0.2  # one pixel of four off by 0.2: MSE 0.01 -> 20 dB
    assert psnr(zeros, other).tolist() == pytest.approx([20.0, 20.0])
    assert psnr(zeros, zeros + 0.5).tolist() == pytest.approx([10 * np.log10(4)] * 2)


def test_ssim_of_constant_images_is_the_luminance_term() -> None:
    a, b = torch.full((1, 1, 8, 8), 0.2), torch.full((1, 1, 8, 8), 0.6)
    c1 = 0.01**2
    assert float(ssim(a, b)[0]) == pytest.approx((2 * 0.2 * 0.6 + c1) / (0.2**2 + 0.6**2 + c1))
    assert float(ssim(a, a)[0]) == pytest.approx(1.0)


def scipy_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM of two 2-D images as scikit-image computes it with gaussian_weights=True, sigma 1.5 (radius 5),
    population statistics, the border of 5 px cropped: an independent check of fedhet's."""
    def blur(x: np.ndarray) -> np.ndarray:
        return gaussian_filter(x, sigma=1.5, truncate=3.5, mode="reflect")

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b, cov = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2, blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    smap = (2 * mu_a * mu_b + c1) * (2 * cov + c2) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(smap[5:-5, 5:-5].mean())


def test_ssim_equals_the_scipy_computation() -> None:
    gen = np.random.default_rng(0)
    a = gen.random((20, 18))
    b = np.clip(a + 0.2 * gen.standard_normal(a.shape), 0, 1)
    ours = ssim(torch.tensor(a)[None, None], torch.tensor(b)[None, None])
    assert float(ours[0]) == pytest.approx(scipy_ssim(a, b), abs=1e-12)
    two = torch.stack([torch.tensor(a), torch.tensor(b)])[None]  # two channels: their mean
    assert float(ssim(two, two.flip(1))[0]) == pytest.approx(scipy_ssim(a, b), abs=1e-12)


def test_small_images_get_the_largest_odd_window() -> None:
    assert (window_side(32, 32), window_side(8, 8), window_side(8, 9), window_side(11, 12)) == (11, 7, 7, 11)


def test_unit_range_per_channel_and_clipped() -> None:
    true = torch.tensor([[[[-1.0, 3.0]], [[0.0, 0.5]]]])  # channel ranges [-1, 3] and [0, 0.5]
    t01, r01 = unit_range(true, torch.tensor([[[[1.0, 5.0]], [[0.25, -2.0]]]]))
    assert t01.flatten().tolist() == [0.0, 1.0, 0.0, 1.0]
    assert r01.flatten().tolist() == [0.5, 1.0, 0.5, 0.0]


def test_best_match_per_true_image() -> None:
    true = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    true[:, :, 0, 0], true[:, :, 0, 1] = 0.0, 1.0  # every image spans [0, 1]: unit_range leaves them as they are
    recon = true[[2, 0, 1]].clone()
    recon[1] += 0.1  # true image 0's reconstruction, off by 0.1 (clipped at 1)
    matches = best_matches(true, recon)
    assert [m["match"] for m in matches] == [1, 2, 0]
    assert matches[1]["psnr"] == matches[2]["psnr"] == 100.0 and matches[1]["ssim"] == pytest.approx(1.0)
    expected = psnr(true[:1], recon[1:2].clamp(0, 1))
    assert matches[0]["psnr"] == pytest.approx(float(expected[0])) and matches[0]["ssim"] < 1.0
