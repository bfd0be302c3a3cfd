"""FedBN (Li et al., ICLR 2021): FedAvg, but every BatchNorm layer stays local.

All BatchNorm parameters (weight, bias) AND buffers (running mean/var, num_batches_tracked) are excluded
from communication, selected by layer type (`_BatchNorm`), not by name.
"""

from __future__ import annotations

from torch import nn

from fedhet.algorithms.base import Algorithm, BatchedStep
from fedhet.algorithms.registry import register
from fedhet.engine.params import BN_TYPES, keys_of_types


@register
class FedBN(Algorithm):
    """Local BatchNorm; everything else averaged."""

    name = "fedbn"
    personalized = True

    def shared_keys(self, model: nn.Module) -> set[str]:
        return set(model.state_dict()) - keys_of_types(model, BN_TYPES)

    def batched_step(self) -> BatchedStep:
        """FedAvg's step; the local BatchNorm keys are kept per client by `fit` (the runtime keeps each
        client's BN statistics in its own lane)."""
        return BatchedStep()
