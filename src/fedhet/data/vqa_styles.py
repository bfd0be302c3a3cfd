"""Image styles for the easy-VQA benchmarks: the visual shift between clients (FedDAT's Domain / Scene benchmarks).

Each style maps uint8 n x 3 x S x S images to the same shape, with strengths relative to the side S so a style
means the same at every image size:
- `clean`: unchanged;
- `inverted`: 255 - x, a photographic negative (colour answers still name the scene's colour, so the
  colour -> pixel map is the client's own: blue looks yellow here);
- `blurred`: Gaussian blur with sigma = S / 24 (shapes lose their corners);
- `noisy`: additive Gaussian pixel noise, std 0.3 of the range, clipped;
- `recoloured`: the light background replaced by a smooth random colour texture (MNIST-M's recipe), the shape
  kept, so background colours compete with the shape's;
- `pixelated`: averaged over S/4 x S/4 cells, then enlarged with nearest-neighbour (blocky shapes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedhet.data.transforms import gaussian_blur
from fedhet.errors import unknown_choice

STYLES = ("clean", "inverted", "blurred", "noisy", "recoloured", "pixelated")


def background_alpha(x: torch.Tensor) -> torch.Tensor:
    """n x 1 x H x W in [0, 1]: 1 where a pixel has the image's background colour (the median border pixel),
    0 on the shape, soft on anti-aliased edges."""
    border = torch.cat([x[:, :, 0], x[:, :, -1], x[:, :, :, 0], x[:, :, :, -1]], dim=2)  # n x 3 x 4S
    bg = border.median(dim=2).values[:, :, None, None]
    dist = (x - bg).abs().sum(1, keepdim=True)  # L1 over channels, 0..765
    return ((90.0 - dist) / 60.0).clamp(0, 1)


def _texture(n: int, size: int, g: torch.Generator, cells: int = 4) -> torch.Tensor:
    """Smooth random colour textures in [0, 255]: two random colours mixed by bicubic-smoothed noise."""
    c1, c2 = torch.rand(n, 3, 1, 1, generator=g), torch.rand(n, 3, 1, 1, generator=g)
    mix = F.interpolate(torch.rand(n, 1, cells, cells, generator=g), size=(size, size), mode="bicubic",
                        align_corners=False).clamp(0, 1)
    return (c1 * mix + c2 * (1 - mix)) * 255.0


def render_style(style: str, images: torch.Tensor, seed: int) -> torch.Tensor:
    """`images` (uint8 n x 3 x S x S) in `style`; random styles draw from a generator seeded with `seed`."""
    if style not in STYLES:
        raise unknown_choice("easy-VQA image style", style, STYLES)
    if style == "clean" or len(images) == 0:
        return images.clone()
    g = torch.Generator().manual_seed(seed)
    x = images.float()
    n, _, size, _ = x.shape
    if style == "inverted":
        out = 255.0 - x
    elif style == "blurred":
        out = gaussian_blur(x, sigma=size / 24)
    elif style == "noisy":
        out = x + 0.3 * 255.0 * torch.randn(x.shape, generator=g)
    elif style == "recoloured":
        alpha = background_alpha(x)
        out = alpha * _texture(n, size, g) + (1 - alpha) * x
    else:  # pixelated
        cells = max(2, size // 4)
        out = F.interpolate(F.adaptive_avg_pool2d(x, cells), size=(size, size), mode="nearest")
    return out.round().clamp(0, 255).to(torch.uint8)
