"""FedBN (Li et al., ICLR 2021): FedAvg, but every BatchNorm layer stays local.

All BatchNorm parameters (weight, bias) AND buffers (running mean/var, num_batches_tracked) are excluded
from communication, selected by layer type (`_BatchNorm`), not by name. A model without BatchNorm is a
ConfigError: FedBN would equal FedAvg without saying so.
"""

from __future__ import annotations

from torch import nn

from fedhet.algorithms.base import ModelAlgorithm, NoParams
from fedhet.algorithms.registry import register
from fedhet.core.params import BN_TYPES, keys_of_types
from fedhet.errors import ConfigError


@register
class FedBN(ModelAlgorithm[NoParams]):
    """Local BatchNorm; everything else averaged."""

    name = "fedbn"
    Params = NoParams
    personalized = True

    def shared_keys(self, model: nn.Module) -> set[str]:
        """Everything but BatchNorm; a model without BatchNorm is an error (FedBN would silently be FedAvg)."""
        local = keys_of_types(model, BN_TYPES)
        if not local:
            raise ConfigError("fedbn keeps the model's BatchNorm layers local, but this model has none, so it would "
                              "run exactly as fedavg; give the model BatchNorm (e.g. model.args.norm=bn) or use fedavg")
        return set(model.state_dict()) - local
