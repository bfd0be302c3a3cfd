"""`offline_digits`: the built-in offline benchmark: real handwritten digits in four rendering styles.

scikit-learn ships UCI's 1,797 real 8x8 handwritten digits (`sklearn.datasets.load_digits`). Each is upsampled
(bilinear) to a 20x20 digit centred in a 28x28 frame (MNIST's framing) and rendered in one of four styles, a
feature shift with identical label semantics:

- `clean`: white stroke on black, greyscale (MNIST-like);
- `inverted`: dark stroke on a light grey background with lower contrast;
- `colored`: a smooth random colour texture with per-pixel noise, the digit drawn as |background - stroke|
  (the MNIST-M blending rule);
- `thick_blur`: dilated strokes, Gaussian blur, a dim tint and additive pixel noise.

The 1,797 images are dealt to the domains stratified by class (disjoint, balanced), with a fixed data seed so
the benchmark is the same for every experiment seed; client splits then depend on the experiment seed.
There is no official test split (test_fraction applies).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset
from fedhet.data.transforms import gaussian_blur
from fedhet.errors import ConfigError

DOMAINS = ("clean", "inverted", "colored", "thick_blur")
CLASSES = tuple(str(i) for i in range(10))
DATA_SEED = 1797
SIZE = 28


@functools.lru_cache(maxsize=1)
def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits as (n x 8 x 8 float32 in [0, 1], labels); reads scikit-learn's bundled CSV directly
    (importing sklearn.datasets costs about a second), falling back to `load_digits`."""
    spec = importlib.util.find_spec("sklearn")
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if csv is not None and csv.is_file():
        raw = np.loadtxt(csv, delimiter=",", dtype=np.float32)
        x, y = raw[:, :-1].reshape(-1, 8, 8), raw[:, -1].astype(np.int64)
    else:
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = d.images.astype(np.float32), d.target.astype(np.int64)
    return x / 16.0, y


def domain_indices(num_domains: int = len(DOMAINS), seed: int = DATA_SEED) -> list[np.ndarray]:
    """Disjoint, class-stratified index sets into the 1,797 images, one per domain."""
    _, y = _raw_digits()
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(num_domains)]
    offset = 0
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        for j, i in enumerate(idx):
            parts[(j + offset) % num_domains].append(int(i))
        offset += len(idx)  # rotate so no domain always gets the class remainders
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


def _frame(img8: torch.Tensor) -> torch.Tensor:
    """n x 8 x 8 in [0, 1] -> n x 1 x 28 x 28: bilinear to 20x20, centred with a 4-pixel border."""
    up = F.interpolate(img8[:, None], size=(20, 20), mode="bilinear", align_corners=False)
    return F.pad(up, (4, 4, 4, 4)).clamp(0, 1)


def _smooth_noise(n: int, channels: int, g: torch.Generator, cells: int = 4) -> torch.Tensor:
    coarse = torch.rand(n, channels, cells, cells, generator=g)
    return F.interpolate(coarse, size=(SIZE, SIZE), mode="bicubic", align_corners=False).clamp(0, 1)


def render(style: str, img8: np.ndarray, seed: int) -> torch.Tensor:
    """Render n 8x8 digits (values in [0, 1]) in `style` -> uint8 n x 3 x 28 x 28."""
    g = torch.Generator().manual_seed(seed)
    v = _frame(torch.from_numpy(img8))
    n = v.shape[0]
    if style == "clean":
        out = v.repeat(1, 3, 1, 1)
    elif style == "inverted":
        bg = 0.75 + 0.2 * torch.rand(n, 1, 1, 1, generator=g)
        out = (bg - 0.55 * v).repeat(1, 3, 1, 1)
    elif style == "colored":
        c1, c2 = torch.rand(n, 3, 1, 1, generator=g), torch.rand(n, 3, 1, 1, generator=g)
        mix = _smooth_noise(n, 1, g)
        bg = c1 * mix + c2 * (1 - mix) + 0.08 * torch.randn(n, 3, SIZE, SIZE, generator=g)
        out = (bg.clamp(0, 1) - v).abs()
    elif style == "thick_blur":
        thick = F.max_pool2d(v, kernel_size=3, stride=1, padding=1)
        soft = gaussian_blur(thick, sigma=1.2, truncate=2.0)
        tint = torch.tensor([0.95, 0.8, 0.55]).view(1, 3, 1, 1)
        out = 0.1 + 0.75 * soft * tint + 0.1 * torch.randn(n, 3, SIZE, SIZE, generator=g)
    else:
        raise ConfigError(f"unknown offline_digits style '{style}'")
    return (out.clamp(0, 1) * 255).round().to(torch.uint8)


@functools.lru_cache(maxsize=len(DOMAINS))
def _domain_tensors(domain: str) -> tuple[torch.Tensor, torch.Tensor]:
    x8, y = _raw_digits()
    idx = domain_indices()[DOMAINS.index(domain)]
    return render(domain, x8[idx], DATA_SEED + DOMAINS.index(domain)), torch.from_numpy(y[idx])


def load_offline_digits_domain(ctx: LoadContext, domain: str) -> DomainData:
    """One offline_digits domain (no files needed)."""
    x, y = _domain_tensors(domain)
    return DomainData(x, y, note=f"sklearn load_digits rendered '{domain}' (seed {DATA_SEED})")


register_dataset(DatasetSpec(
    name="offline_digits", domains=DOMAINS, classes=CLASSES, modality="image", loader=load_offline_digits_domain,
    source="scikit-learn load_digits (UCI Optical Recognition of Handwritten Digits, "
           "https://archive.ics.uci.edu/dataset/80), rendered in four styles by fedhet",
    layout="(built in: nothing to download)", default_image_size=28, hflip=False, builtin=True,
))
