"""Embedding-noise augmentation: the U(-gamma, gamma) / Lap(0, gamma) / N(0, gamma) baselines of FRAug's Table 7.

FRAug (Chen et al., ICCV 2023, Sec. 4.3.4) compares its learned residuals with random ones: the head is trained on
the real embeddings u = f(x) and on u + delta_u with delta_u drawn i.i.d. per entry from
  uniform:  U(-gamma, gamma)        (variance gamma^2 / 3)
  laplace:  Laplace(0, scale gamma) (variance 2 gamma^2)
  gaussian: N(0, gamma^2)           (gamma is the standard deviation)
Local loss: CE(h(f(x)), y) + CE(h(u.detach() + delta_u), y); the noisy term reaches the head only, as FRAug's
L_syn does. Noise is drawn from torch's global RNG (seeded per run, round and client by the engine).

Choices the paper leaves open: gamma's value (default 0.1; the paper searched it, values not given), whether
gamma is a std or a variance for N(0, gamma) (a std here), the base method (`local_bn=True`: local BatchNorm as
FRAug, so the only difference from FRAug is the augmentation; `local_bn=False`: FedAvg).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.algorithms.base import Capabilities, ModelAlgorithm
from fedhet.algorithms.registry import register
from fedhet.core.contract import Work
from fedhet.core.params import BN_TYPES, keys_of_types
from fedhet.errors import ConfigError

DISTRIBUTIONS = ("uniform", "laplace", "gaussian")


def sample_noise(shape: torch.Size | tuple[int, ...], distribution: str, gamma: float,
                 device: torch.device | None = None) -> torch.Tensor:
    """i.i.d. zero-mean noise of the given shape from torch's global RNG."""
    if distribution == "uniform":
        return (torch.rand(shape, device=device) * 2 - 1) * gamma
    if distribution == "laplace":  # inverse CDF of Laplace(0, gamma) on u ~ U(-1/2, 1/2)
        u = torch.rand(shape, device=device).clamp(1e-7, 1 - 1e-7) - 0.5
        return -gamma * u.sign() * torch.log1p(-2 * u.abs())
    if distribution == "gaussian":
        return torch.randn(shape, device=device) * gamma
    raise ConfigError(f"embnoise: distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")


@dataclass
class EmbeddingNoiseParams:
    """distribution: uniform | laplace | gaussian; gamma: noise scale (> 0); local_bn: FedBN-style BN."""

    distribution: str = "gaussian"
    gamma: float = 0.1
    local_bn: bool = True

    def validate(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(f"embnoise: distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                              f"got {self.distribution!r}")
        if not self.gamma > 0:
            raise ConfigError(f"embnoise: gamma must be > 0, got {self.gamma}")


@register
class EmbeddingNoise(ModelAlgorithm[EmbeddingNoiseParams]):
    """The head is trained on real and on randomly perturbed embeddings."""

    name = "embnoise"
    personalized = True
    Params = EmbeddingNoiseParams
    capabilities = Capabilities(call_params=frozenset({"distribution", "gamma"}))  # read in `loss` only

    def __init__(self, params: EmbeddingNoiseParams, *args: Any, **kwargs: Any) -> None:  # Any: to Algorithm.__init__
        super().__init__(params, *args, **kwargs)
        self.personalized = bool(params.local_bn)

    def shared_keys(self, model: nn.Module) -> set[str]:
        """Everything but BatchNorm with `local_bn` (FedBN), else everything (FedAvg)."""
        keys = set(model.state_dict())
        return keys - keys_of_types(model, BN_TYPES) if self.params.local_bn else keys

    def loss(self, work: Work, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE on the real embeddings plus CE of the head on noisy, detached embeddings."""
        model = work.model
        u = model.features(x)
        noisy = u.detach() + sample_noise(u.shape, self.params.distribution, self.params.gamma, u.device)
        return F.cross_entropy(model.head(u), y) + F.cross_entropy(model.head(noisy), y)
