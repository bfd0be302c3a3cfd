"""Fourier Domain Adaptation's style transfer (Yang & Soatto, CVPR 2020), pure `torch.fft` functions.

FDA swaps the low-frequency amplitude spectrum of a source image for a target one's and keeps the source phase:
    x_{s->t} = F^{-1}( [M_b * A_t + (1 - M_b) * A_s], P_s ),
with M_b the centred (2b+1) x (2b+1) window of the shifted spectrum, b = floor(min(H, W) * beta) (FDA's
`FDA_source_to_target_np`; beta in {0.01, 0.05, 0.09} in the paper). Fed-SFDA (AdaptFED Sec. 3.4, spec 2.7) has
each client send only its style: the mean over its images of that window of |F| (no phase, so no image can be
rebuilt from it), shape C x (2b+1) x (2b+1).

The DC bin (the channel sum) carries its signed value: for a raw image it is real and positive, so this is its
amplitude with phase 0, exactly FDA; for images normalised per channel ((x - m) / s, as fedhet's transforms do) the
sign is kept, which makes the transfer commute with the normalisation (every other bin just scales by 1 / s).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedhet.errors import ConfigError

__all__ = ["fda_band", "fda_transfer", "low_band", "style_of"]


def fda_band(height: int, width: int, beta: float) -> int:
    """FDA's half-width b = floor(min(H, W) * beta) of the low-frequency window (b = 0: the DC bin alone)."""
    if not 0.0 <= beta < 0.5:
        raise ConfigError(f"FDA beta must be in [0, 0.5), got {beta}; FDA uses 0.01, 0.05 or 0.09")
    return math.floor(min(height, width) * beta)  # beta < 0.5 keeps the window inside the spectrum


def _window(height: int, width: int, b: int) -> tuple[slice, slice]:
    """Rows and columns of the (2b+1) x (2b+1) window around DC in the fftshift-ed spectrum."""
    ch, cw = height // 2, width // 2
    return slice(ch - b, ch + b + 1), slice(cw - b, cw + b + 1)


def _spectrum(x: Tensor) -> Tensor:
    """The centred 2-D spectrum of float images ... x H x W."""
    out: Tensor = torch.fft.fftshift(torch.fft.fft2(x.float()), dim=(-2, -1))  # torch.fft is untyped
    return out


def low_band(x: Tensor, b: int) -> Tensor:
    """Each image's low-frequency amplitude window, ... x C x (2b+1) x (2b+1), its centre the signed DC value."""
    spec = _spectrum(x)
    rows, cols = _window(x.shape[-2], x.shape[-1], b)
    band = spec[..., rows, cols].abs()
    band[..., b, b] = spec[..., x.shape[-2] // 2, x.shape[-1] // 2].real
    return band


def style_of(x: Tensor, b: int) -> Tensor:
    """A set of images' style: the mean of their low bands (N x C x H x W -> C x (2b+1) x (2b+1))."""
    return low_band(x, b).mean(dim=0)


def fda_transfer(x: Tensor, style: Tensor, b: int) -> Tensor:
    """The images `x` (N x C x H x W) with the low band of their amplitude replaced by `style` (C x w x w, or one
    per image N x C x w x w, w = 2b+1) and their phase kept; real float output of x's shape."""
    w = 2 * b + 1
    if tuple(style.shape[-3:]) != (x.shape[-3], w, w):
        raise ConfigError(f"an FDA style of shape {tuple(style.shape)} does not fit images {tuple(x.shape)} with "
                          f"band half-width {b} (expected ... x {x.shape[-3]} x {w} x {w}); clients and server must "
                          "use the same image size and beta")
    spec = _spectrum(x)
    rows, cols = _window(x.shape[-2], x.shape[-1], b)
    amp, phase = spec.abs(), spec.angle()
    amp[..., rows, cols] = style.to(amp.dtype).expand(*amp.shape[:-2], w, w)
    mixed = torch.polar(amp, phase)
    ch, cw = x.shape[-2] // 2, x.shape[-1] // 2
    mixed[..., ch, cw] = style[..., b, b].to(amp.dtype).expand(amp.shape[:-2]).to(mixed.dtype)
    out: Tensor = torch.fft.ifft2(torch.fft.ifftshift(mixed, dim=(-2, -1))).real  # torch.fft is untyped
    return out
