"""Supervised training of a model on the server, on tensors the server holds (Fed-SFDA's source pre-training on
D_S and its FDA copy; FedBiP's classifier on D_syn, Eq. 6)."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.config import TrainConfig
from fedhet.core.optim import make_optimizer
from fedhet.losses.descent import descend

log = logging.getLogger(__name__)


def train_on_tensors(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, train: TrainConfig,
                     lr: float, device: torch.device, hflip: bool = False, what: str = "server training",
                     lr_setting: str = "train.lr") -> float:
    """Cross-entropy training on (x, y) for `epochs` epochs with the train config's optimizer and batch size
    (shuffling and random horizontal flips, when `hflip`, from torch's global RNG); a batch of one sample is
    skipped (BatchNorm). Returns the last epoch's mean loss; a NaN / inf loss is a TrainingDivergedError that
    names `what` and `lr_setting`."""
    x, y = x.to(device), y.to(device)
    opt, bs, n = make_optimizer(model.parameters(), train, lr), train.batch_size, len(y)
    model.train()
    mean = float("nan")
    for _ in range(epochs):
        order, total, steps = torch.randperm(n, device=device), 0.0, 0
        for i in range(0, n, bs):
            idx = order[i:i + bs]
            if len(idx) < 2:
                continue
            xb = x[idx]
            if hflip:
                flip = torch.rand(len(idx), device=device) < 0.5
                xb = torch.where(flip.view(-1, 1, 1, 1), xb.flip(-1), xb)
            loss = F.cross_entropy(model(xb), y[idx])
            descend(opt, loss, what, f"lower {lr_setting}")
            total, steps = total + float(loss.detach()), steps + 1
        mean = total / max(steps, 1)
        log.info("%s: epoch loss %.4f", what, mean)
    return mean
