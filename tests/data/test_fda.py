"""FDA style extraction and transfer (fedhet.data.fda) against the spectrum itself."""

from __future__ import annotations

import pytest
import torch

from fedhet.data.fda import fda_band, fda_transfer, low_band, style_of
from fedhet.errors import ConfigError

torch.set_num_threads(1)


def images(n: int, seed: int, size: int = 16, offset: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g) + offset


def centred(x: torch.Tensor) -> torch.Tensor:
    return torch.fft.fftshift(torch.fft.fft2(x.double()), dim=(-2, -1))


def test_band_is_fdas_floor_of_size_times_beta() -> None:
    assert [fda_band(32, 32, beta) for beta in (0.01, 0.05, 0.09)] == [0, 1, 2]
    assert fda_band(64, 48, 0.09) == 4  # min(H, W) = 48
    assert fda_band(8, 8, 0.49) == 3 and fda_band(9, 9, 0.49) == 4  # the widest windows that fit
    for bad in (-0.1, 0.5):
        with pytest.raises(ConfigError, match="beta must be in"):
            fda_band(8, 8, bad)


@pytest.mark.parametrize("b", [0, 1, 2])
def test_swap_replaces_exactly_the_low_band_and_keeps_the_phase(b: int) -> None:
    x, target = images(2, 0), images(5, 1)
    style = style_of(target, b)
    out = centred(fda_transfer(x, style, b))
    src = centred(x)
    c = 8  # DC of a 16 x 16 shifted spectrum
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[c - b:c + b + 1, c - b:c + b + 1] = True
    # inside the window: the style's amplitude (the DC bin its signed value); outside: the source's amplitude
    got = out.abs()[..., inside].reshape(2, 3, 2 * b + 1, 2 * b + 1)
    want = style.double().expand(2, 3, 2 * b + 1, 2 * b + 1).clone()
    want[..., b, b] = want[..., b, b].abs()
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(out.abs()[..., ~inside], src.abs()[..., ~inside], atol=1e-4)
    assert torch.allclose(out[..., c, c].real, style[..., b, b].double().expand(2, 3), atol=1e-4)
    # the phase is the source's at every bin but DC (unit phasors compared, so no wrap-around)
    not_dc = torch.ones(16, 16, dtype=torch.bool)
    not_dc[c, c] = False
    unit = lambda s: s[..., not_dc] / s[..., not_dc].abs()  # noqa: E731
    assert torch.allclose(unit(out), unit(src), atol=1e-4)


def test_zero_band_moves_only_the_channel_means() -> None:
    x, target = images(3, 2), images(4, 3, offset=0.5)
    out = fda_transfer(x, style_of(target, 0), 0)
    want = x - x.mean(dim=(-2, -1), keepdim=True) + target.mean(dim=(0, 2, 3)).view(1, 3, 1, 1)
    assert torch.allclose(out, want, atol=1e-5)


def test_transfer_commutes_with_per_channel_normalisation() -> None:
    """FDA on normalised images equals normalising FDA's raw output, also when the normalised means of source and
    target have opposite signs (a plain amplitude swap of the DC bin would flip the target's mean)."""
    mean, std = torch.tensor([0.2, 0.5, 0.8]).view(1, 3, 1, 1), torch.tensor([0.3, 0.2, 0.1]).view(1, 3, 1, 1)
    x, target = images(2, 4) * 0.3, images(6, 5) * 0.3 + 0.7  # dark source, bright target

    def norm(t: torch.Tensor) -> torch.Tensor:
        return (t - mean) / std

    raw = fda_transfer(x, style_of(target, 2), 2)
    normalised = fda_transfer(norm(x), style_of(norm(target), 2), 2)
    assert torch.allclose(normalised, norm(raw), atol=1e-4)


def test_style_carries_no_phase_and_no_pixels() -> None:
    """A circular shift changes only the phase: the style of shifted images is the same, and the style is a
    (2b+1)^2 window per channel, far smaller than an image."""
    x = images(4, 6)
    shifted = torch.roll(x, shifts=(3, 5), dims=(-2, -1))
    assert torch.allclose(style_of(x, 2), style_of(shifted, 2), atol=1e-4)
    assert style_of(x, 2).shape == (3, 5, 5) and low_band(x, 2).shape == (4, 3, 5, 5)


def test_per_image_styles_and_shape_errors() -> None:
    x, a, b_ = images(2, 7), images(3, 8), images(3, 9, offset=1.0)
    per_image = torch.stack([style_of(a, 1), style_of(b_, 1)])
    out = fda_transfer(x, per_image, 1)
    assert torch.allclose(out[0], fda_transfer(x[:1], style_of(a, 1), 1)[0], atol=1e-5)
    assert torch.allclose(out[1], fda_transfer(x[1:], style_of(b_, 1), 1)[0], atol=1e-5)
    with pytest.raises(ConfigError, match="same image size and beta"):
        fda_transfer(x, style_of(a, 2), 1)
