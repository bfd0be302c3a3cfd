"""Single: every client trains alone on its own data; nothing is communicated (FRAug Table 2 baseline)."""

from __future__ import annotations

from torch import nn

from fedhet.algorithms.base import ModelAlgorithm, NoParams
from fedhet.algorithms.registry import register


@register
class Single(ModelAlgorithm[NoParams]):
    """No shared keys: the whole model is client state; a 'round' is one local training pass."""

    name = "single"
    Params = NoParams
    personalized = True

    def shared_keys(self, model: nn.Module) -> set[str]:
        return set()
