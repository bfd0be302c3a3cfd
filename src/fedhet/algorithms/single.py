"""Single: every client trains alone on its own data; nothing is communicated (FRAug Table 2 baseline)."""

from __future__ import annotations

from torch import nn

from fedhet.algorithms.base import ModelAlgorithm
from fedhet.algorithms.registry import register


@register
class Single(ModelAlgorithm):
    """No shared keys: the whole model is client state; a 'round' is one local training pass."""

    name = "single"
    personalized = True

    def shared_keys(self, model: nn.Module) -> set[str]:
        return set()
