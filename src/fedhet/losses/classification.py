"""The plain supervised objective."""

from __future__ import annotations

import torch
from torch import nn


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of `model(x)` against labels `y`."""
    return nn.functional.cross_entropy(model(x), y)
