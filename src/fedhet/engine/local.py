"""Local training and evaluation on one client: optimizer, mini-batch loop, NaN guard, metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from fedhet.config import TrainConfig
from fedhet.errors import TrainingDivergedError

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def make_optimizer(params: Iterator[nn.Parameter] | list, cfg: TrainConfig, lr: float | None = None
                   ) -> torch.optim.Optimizer:
    """SGD (with momentum / weight decay), Adam (L2 weight decay) or AdamW (decoupled), from the train config."""
    lr = cfg.lr if lr is None else lr
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def batches(dataset: Dataset, cfg: TrainConfig, generator: torch.Generator | None = None,
            device: torch.device | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled mini-batches for one round: `local_steps` batches if set, else `local_epochs` epochs.

    Shuffling draws from `generator` (or torch's global RNG, which the engine seeds per client and round).
    A last batch of a single sample is dropped from each pass (`drops_singleton`): BatchNorm cannot train on
    one sample, and the sample is back in the next pass's shuffle.
    """
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        return
    bs = min(cfg.batch_size, n)
    loader = DataLoader(dataset, batch_size=bs, shuffle=True, drop_last=drops_singleton(n, bs), generator=generator)
    steps = num_steps(n, cfg)
    done = 0
    while done < steps:
        for x, y in loader:
            if device is not None:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y
            done += 1
            if done >= steps:
                return


def drops_singleton(n: int, batch_size: int) -> bool:
    """Whether a pass over n samples in batches of `batch_size` would end with a batch of one (then dropped)."""
    return n > 1 and n % batch_size == 1


def num_steps(n: int, cfg: TrainConfig) -> int:
    """How many mini-batches `batches` yields for a dataset of size n."""
    if n == 0:
        return 0
    bs = min(cfg.batch_size, n)
    per_epoch = n // bs if drops_singleton(n, bs) else math.ceil(n / bs)
    return cfg.local_steps if cfg.local_steps is not None else cfg.local_epochs * per_epoch


DIVERGED_ADVICE = (
    "lower train.lr (or server.lr), add train.grad_clip, or check the data for NaNs. The checkpoint of the last "
    "finite round is kept: continue it with `--resume --allow-config-change KEY[,KEY...]` naming every key you "
    "changed (e.g. train.lr), or start again with `--overwrite`.")


def check_finite(loss: torch.Tensor, where: str) -> None:
    """Stop with a clear message when the loss is NaN or infinite."""
    if not torch.isfinite(loss).all():
        raise TrainingDivergedError(f"loss became {loss.item()} in {where}; {DIVERGED_ADVICE}")


def first_nonfinite(tree: object, path: str = "") -> str | None:
    """The dotted path of the first floating-point tensor holding NaN / inf in a nested dict / list of tensors
    (a server state), or None when all are finite."""
    if isinstance(tree, torch.Tensor):
        return path if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else None
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, value in items:
        found = first_nonfinite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The plain supervised loss."""
    return nn.functional.cross_entropy(model(x), y)


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, where: str,
                   grad_clip: float | None = None, after_backward: Callable[[], None] | None = None) -> float:
    """One optimizer step on `loss`: NaN guard, backward, optional gradient edit and clipping, step."""
    check_finite(loss, where)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if after_backward is not None:
        after_backward()
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return float(loss.detach())


@dataclass
class TrainStats:
    """What a local training pass reports back."""

    loss: float
    steps: int
    examples: int


def train_local(model: nn.Module, dataset: Dataset, cfg: TrainConfig, device: torch.device,
                loss_fn: LossFn = cross_entropy, optimizer: torch.optim.Optimizer | None = None,
                after_backward: Callable[[], None] | None = None, where: str = "local training",
                lr: float | None = None) -> TrainStats:
    """Run one round of local SGD on `model` (in place) and return the mean loss."""
    model.train()
    opt = optimizer if optimizer is not None else make_optimizer(model.parameters(), cfg, lr)
    total, steps, seen = 0.0, 0, 0
    for x, y in batches(dataset, cfg, device=device):
        total += optimizer_step(model, opt, loss_fn(model, x, y), where, cfg.grad_clip, after_backward)
        steps += 1
        seen += len(y)
    return TrainStats(loss=total / max(steps, 1), steps=steps, examples=seen)


def balanced_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean per-class recall over the classes present in y_true."""
    classes = np.unique(y_true)
    if len(classes) == 0:
        return float("nan")
    return float(np.mean([(y_pred[y_true == c] == c).mean() for c in classes]))


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Dataset, device: torch.device, batch_size: int = 256
             ) -> dict[str, float]:
    """Accuracy, balanced accuracy and mean cross-entropy of `model` on `dataset`."""
    model.eval()
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        return {"accuracy": float("nan"), "balanced_accuracy": float("nan"), "loss": float("nan"),
                "num_examples": 0}
    loss_sum, preds, labels = 0.0, [], []
    for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        preds.append(logits.argmax(1).cpu().numpy())
        labels.append(y.cpu().numpy())
    y_true, y_pred = np.concatenate(labels), np.concatenate(preds)
    return {"accuracy": float((y_true == y_pred).mean()), "balanced_accuracy": balanced_accuracy(y_true, y_pred),
            "loss": loss_sum / n, "num_examples": n}
