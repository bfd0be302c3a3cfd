"""A SynthDigits generator: digits 0-9 rendered in the TrueType fonts that ship with matplotlib.

Follows the published recipe (Ganin & Lempitsky 2015, "Unsupervised Domain Adaptation by Backpropagation":
synthetic numbers rendered from Windows fonts with varying position, orientation, background and stroke
colours, and blur). Windows fonts are not available everywhere, and the fonts installed on a machine differ
between machines, so only the fonts matplotlib (a fedhet dependency) ships in `<mpl-data>/fonts/ttf/` are
used: the DejaVu Sans / Sans Mono / Serif and STIX General families (4 styles each) and five Computer Modern
faces, 21 fonts. Symbol fonts without ASCII digits are left out. Like SVHN crops (which SynthDigits
imitates), the labelled digit is centred and may have partly visible neighbour digits on either side.
Output is deterministic given (n, seed, size), the same on every machine with the same matplotlib fonts and
Pillow/FreeType rasteriser.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from fedhet.errors import FedhetError

SHIPPED_FONTS = (  # file names under matplotlib's fonts/ttf/, all with ASCII digits (checked by a test)
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf", "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
    "cmr10.ttf", "cmb10.ttf", "cmti10.ttf", "cmss10.ttf", "cmtt10.ttf",
)


def font_dir() -> Path:
    """matplotlib's bundled TrueType folder (`matplotlib.get_data_path()/fonts/ttf`)."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@functools.lru_cache(maxsize=1)
def find_fonts() -> tuple[Path, ...]:
    """The fonts SynthDigits is rendered from: SHIPPED_FONTS in matplotlib's font folder, in that order."""
    base = font_dir()
    missing = [n for n in SHIPPED_FONTS if not (base / n).is_file()]
    if missing:
        raise FedhetError(f"SynthDigits needs the fonts matplotlib ships, but {', '.join(missing)} is missing from "
                          f"{base}; reinstall matplotlib (pip install --force-reinstall matplotlib)")
    return tuple(base / n for n in SHIPPED_FONTS)


def _font(fonts: tuple[Path, ...], idx: int, px: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(fonts[idx % len(fonts)]), px)


def _luma(c: np.ndarray) -> float:
    return float(0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2])


def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    bg = rng.integers(0, 256, 3)
    for _ in range(20):
        fg = rng.integers(0, 256, 3)
        if abs(_luma(fg) - _luma(bg)) > 70:
            return bg, fg
    return bg, 255 - bg


def render_digit(label: int, rng: np.random.Generator, fonts: tuple[Path, ...], size: int = 32) -> np.ndarray:
    """One size x size x 3 uint8 image of digit `label` (rendered at 2x, then downsampled)."""
    big = 2 * size
    px = int(big * rng.uniform(0.55, 0.9))
    font = _font(fonts, int(rng.integers(1 << 30)), px)
    mask = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(mask)
    cx = big / 2 + rng.uniform(-0.08, 0.08) * big
    cy = big / 2 + rng.uniform(-0.08, 0.08) * big
    l, t, r, b = draw.textbbox((0, 0), str(label), font=font)
    w, h = r - l, b - t
    draw.text((cx - w / 2 - l, cy - h / 2 - t), str(label), fill=255, font=font)
    gap = rng.uniform(0.05, 0.25) * w
    if rng.random() < 0.5:  # left neighbour
        s = str(rng.integers(10))
        l2, _, r2, _ = draw.textbbox((0, 0), s, font=font)
        draw.text((cx - w / 2 - gap - (r2 - l2) - l2, cy - h / 2 - t), s, fill=255, font=font)
    if rng.random() < 0.5:  # right neighbour
        s = str(rng.integers(10))
        l2 = draw.textbbox((0, 0), s, font=font)[0]
        draw.text((cx + w / 2 + gap - l2, cy - h / 2 - t), s, fill=255, font=font)
    mask = mask.rotate(rng.uniform(-15, 15), resample=Image.Resampling.BICUBIC, center=(cx, cy))
    radius = rng.uniform(0.0, 2.0)
    if radius > 0.3:
        mask = mask.filter(ImageFilter.GaussianBlur(radius))
    m = np.asarray(mask.resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)[..., None] / 255.0
    bg, fg = _colours(rng)
    img = bg[None, None, :] * (1.0 - m) + fg[None, None, :] * m
    img = img + rng.normal(0.0, rng.uniform(0.0, 6.0), img.shape)
    return np.asarray(np.clip(np.rint(img), 0, 255).astype(np.uint8))


@functools.lru_cache(maxsize=4)
def generate_synth_digits(n: int, seed: int, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """n images (n x size x size x 3 uint8) with balanced labels 0-9, deterministic from `seed`.

    Cached per process; treat the returned arrays as read-only.
    """
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 10).astype(np.int64)
    fonts = find_fonts()
    x = np.stack([render_digit(int(c), rng, fonts, size) for c in labels]) if n else np.zeros(
        (0, size, size, 3), np.uint8)
    x.setflags(write=False)
    labels.setflags(write=False)
    return x, labels


def save_synth_digits(path: str | Path, n_train: int = 5000, n_test: int = 1000, seed: int = 0) -> None:
    """Write a synth_digits.npz (x, y, split) in the layout the digits loader reads."""
    xtr, ytr = generate_synth_digits(n_train, seed)
    xte, yte = generate_synth_digits(n_test, seed + 1)
    np.savez_compressed(path, x=np.concatenate([xtr, xte]), y=np.concatenate([ytr, yte]),
                        split=np.r_[np.zeros(n_train, np.uint8), np.ones(n_test, np.uint8)],
                        classes=np.array([str(i) for i in range(10)]))
