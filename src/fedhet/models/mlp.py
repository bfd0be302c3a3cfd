"""A multilayer perceptron for feature vectors (e.g. Office-Caltech10 SURF, 800-d; Fed-Heart-Disease, 13-d).

Fed-Heart-Disease in FLamby (du Terrail et al., NeurIPS 2022 D&B) uses logistic regression on 13 features;
`hidden=[]` is not allowed here (there must be a feature layer), use a single small hidden layer instead.
Inputs of any shape are flattened.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from fedhet.errors import ConfigError
from fedhet.models.base import SplitModel, check_norm, no_pretrained, norm1d, register_model


@register_model("mlp")
def mlp(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    hidden: Sequence[int] = (256, 128),
    norm: str = "none",
    dropout: float = 0.0,
) -> SplitModel:
    """Flatten | [Linear, norm, ReLU, Dropout] per hidden size as features; last Linear as head."""
    no_pretrained("mlp", pretrained)
    check_norm("mlp", norm)
    sizes = [int(h) for h in hidden]
    if not sizes or any(h < 1 for h in sizes):
        raise ConfigError(f"model 'mlp': hidden must be a non-empty list of positive sizes, got {hidden!r}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"model 'mlp': dropout must be in [0, 1), got {dropout}")
    layers: list[nn.Module] = [nn.Flatten()]
    prev = math.prod(input_shape)
    for h in sizes:
        layers += [nn.Linear(prev, h), norm1d(norm, h), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        prev = h
    return SplitModel(nn.Sequential(*layers), nn.Linear(prev, num_classes), prev, num_classes)
