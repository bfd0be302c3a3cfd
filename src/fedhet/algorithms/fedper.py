"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization Layers", arXiv
1912.00818, 2019): base layers shared and FedAvg-ed, personalization layers kept by each client.

Every local epoch trains base and personalization layers together (the paper's Algorithm 1, unlike FedRep's
head-then-body phases); the server averages only the base layers; a client deploys the global base with its
own personalization layers. `personal` names the personalization layers as submodule names (default the
classifier `head`, the paper's K_P = 1 / AdaptFED's FedPER-T); their parameters and buffers never leave the
client. A client's personalization layers start from the seeded initial model (the same for everyone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from fedhet.algorithms.base import ModelAlgorithm
from fedhet.algorithms.registry import register
from fedhet.core.params import keys_under
from fedhet.errors import ConfigError


@dataclass
class FedPerParams:
    """personal: submodule names of the personalization layers (kept local), e.g. [head] or
    [head, features.norm]."""

    personal: list[str] = field(default_factory=lambda: ["head"])

    def validate(self) -> None:
        if not self.personal:
            raise ConfigError("fedper: method_args.personal must name at least one submodule (e.g. [head]); "
                              "with none it would be fedavg")


@register
class FedPer(ModelAlgorithm[FedPerParams]):
    """Shared base layers, local personalization layers, trained jointly."""

    name = "fedper"
    personalized = True
    Params = FedPerParams

    def shared_keys(self, model: nn.Module) -> set[str]:
        """Everything except the personalization layers' state; an unknown submodule is a ConfigError."""
        names = dict(model.named_modules())
        local: set[str] = set()
        for sub in self.params.personal:
            if sub not in names:
                raise ConfigError(f"fedper: the model has no submodule '{sub}' (method_args.personal); top-level "
                                  f"submodules: {', '.join(n for n, _ in model.named_children())}")
            local |= keys_under(model, sub)
        return set(model.state_dict()) - local
