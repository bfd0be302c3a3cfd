"""A small CPU-friendly CNN: three 3x3 conv blocks (width, 2*width, 2*width) and an FC embedding.

A LeNet/FedAvg-style network (McMahan et al., AISTATS 2017 use a 2-conv CNN) sized for fast CPU tests and
smoke runs; adaptive pooling makes it work for any input side >= 4.
"""

from __future__ import annotations

from torch import nn

from fedhet.errors import ConfigError
from fedhet.models.base import (
    SplitModel,
    check_image_shape,
    check_norm,
    no_pretrained,
    norm1d,
    norm2d,
    register_model,
)


def _block(cin: int, cout: int, norm: str) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, 1, 1, bias=norm != "bn"), norm2d(norm, cout), nn.ReLU()]


@register_model("small_cnn")
def small_cnn(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    width: int = 32,
    embed_dim: int = 128,
    norm: str = "bn",
    dropout: float = 0.0,
) -> SplitModel:
    """conv(w)-pool | conv(2w)-pool | conv(2w)-avgpool(2x2) | FC(8w -> embed_dim) features; FC head."""
    no_pretrained("small_cnn", pretrained)
    check_norm("small_cnn", norm)
    c, _, _ = check_image_shape("small_cnn", input_shape, min_side=4)
    if width < 1 or embed_dim < 1:
        raise ConfigError(f"model 'small_cnn': width and embed_dim must be >= 1, got {width}, {embed_dim}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"model 'small_cnn': dropout must be in [0, 1), got {dropout}")
    features = nn.Sequential(
        *_block(c, width, norm),
        nn.MaxPool2d(2),
        *_block(width, 2 * width, norm),
        nn.MaxPool2d(2),
        *_block(2 * width, 2 * width, norm),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * width, embed_dim),
        norm1d(norm, embed_dim),
        nn.ReLU(),
        nn.Dropout(dropout),
    )
    return SplitModel(features, nn.Linear(embed_dim, num_classes), embed_dim, num_classes)
