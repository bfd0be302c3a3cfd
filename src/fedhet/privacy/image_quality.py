"""How close a reconstructed image is to the true one: PSNR and SSIM, and the best match per true image.

Neither torchmetrics nor scikit-image is a fedhet dependency, so SSIM is written here after Wang, Bovik, Sheikh &
Simoncelli 2004 ("Image quality assessment: from error visibility to structural similarity", IEEE TIP 13(4)),
with their constants and window: an 11 x 11 Gaussian window of sigma 1.5 (scikit-image's `gaussian_weights=True`:
a radius of int(3.5 sigma + 0.5) = 5), K1 = 0.01, K2 = 0.03, data range L = 1, population (not sample)
statistics, the SSIM map on the window's valid positions only (scikit-image crops the reflected border the same
way) and its mean over positions and channels. An image smaller than 11 px gets the largest odd window that fits
(7 for 8 x 8), with the same sigma.

Images are compared in [0, 1]: both are mapped by the true batch's own range per channel, (x - min_c) /
(max_c - min_c), and the reconstruction is then clipped to [0, 1]. For images whose every channel reaches 0 and 1
before normalisation (digits) this is the PSNR of the de-normalised images that Geiping et al. 2020 report; else it
is relative to the batch's own dynamic range. PSNR = 10 log10(1 / MSE) per image (inversefed's `psnr`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

K1, K2, SIGMA, WINDOW = 0.01, 0.03, 1.5, 11


def unit_range(true: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both N x C x H x W batches mapped by the true batch's per-channel range to [0, 1] (module docstring)."""
    true, other = true.detach().double().cpu(), other.detach().double().cpu()
    low = true.amin(dim=(0, 2, 3), keepdim=True)
    span = (true.amax(dim=(0, 2, 3), keepdim=True) - low).clamp_min(1e-12)
    return (true - low) / span, ((other - low) / span).clamp(0.0, 1.0)


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """PSNR in dB of each image pair of two N x C x H x W batches in [0, 1] (inf for identical images)."""
    mse = (a.double() - b.double()).pow(2).flatten(1).mean(1)
    return 10.0 * torch.log10(1.0 / mse)


def gaussian_window(side: int) -> torch.Tensor:
    """The normalised side x side Gaussian window of sigma 1.5."""
    t = torch.arange(side, dtype=torch.float64) - (side - 1) / 2
    g = torch.exp(-(t**2) / (2 * SIGMA**2))
    return torch.outer(g, g) / g.sum() ** 2


def window_side(height: int, width: int) -> int:
    """11, or the largest odd side that fits a smaller image."""
    side = min(WINDOW, height, width)
    return side if side % 2 == 1 else side - 1


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean SSIM of each image pair of two N x C x H x W batches in [0, 1] (Wang et al. 2004, module docstring)."""
    a, b = a.double(), b.double()
    n, c, h, w = a.shape
    kernel = gaussian_window(window_side(h, w)).expand(c, 1, -1, -1)

    def blur(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, kernel, groups=c)  # valid positions only

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = K1**2, K2**2
    smap = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return smap.reshape(n, -1).mean(1)


def best_matches(true: torch.Tensor, recon: torch.Tensor) -> list[dict[str, float | int]]:
    """For each true image, the reconstruction with the highest PSNR against it (any of the batch: the order of
    a reconstructed batch is arbitrary), with that PSNR and its SSIM, after `unit_range`."""
    t01, r01 = unit_range(true, recon)
    out: list[dict[str, float | int]] = []
    for i in range(len(t01)):
        target = t01[i: i + 1].expand_as(r01)
        scores = psnr(target, r01)
        j = int(torch.argmax(scores))
        value = float(scores[j])
        out.append({"match": j, "psnr": value if math.isfinite(value) else 100.0,
                    "ssim": float(ssim(t01[i: i + 1], r01[j: j + 1])[0])})
    return out
