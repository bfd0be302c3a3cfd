"""Build a torch optimizer from an `OptimSpec` (the contract's description) or from the train config: the one place
where fedhet turns `train.optimizer` into SGD / Adam / AdamW (the engine's passes, and an algorithm's own server-
side training such as Fed-SFDA's source pretraining)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from fedhet.config import TrainConfig
from fedhet.core.contract import OptimSpec


def build_optimizer(spec: OptimSpec) -> torch.optim.Optimizer:
    """SGD (momentum, weight decay), Adam (L2 weight decay) or AdamW (decoupled) over the trainable params."""
    params = [p for p in spec.params if p.requires_grad]
    if spec.kind == "adam":
        return torch.optim.Adam(params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)
    if spec.kind == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


def make_optimizer(params: Iterable[nn.Parameter], cfg: TrainConfig, lr: float | None = None) -> torch.optim.Optimizer:
    """The train config's optimizer over `params` (those with requires_grad)."""
    return build_optimizer(OptimSpec.from_train(list(params), cfg, lr))
