"""Metrics of a model on a dataset: accuracy, balanced accuracy, mean cross-entropy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedhet.core.batches import restrict_logits, to_device
from fedhet.core.protocols import SampleSet, num_samples
from fedhet.engine.batching import in_order


def balanced_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean per-class recall over the classes present in y_true."""
    classes = np.unique(y_true)
    if len(classes) == 0:
        return float("nan")
    return float(np.mean([(y_pred[y_true == c] == c).mean() for c in classes]))


@torch.no_grad()
def evaluate(model: nn.Module, dataset: SampleSet, device: torch.device, batch_size: int = 256,
             classes: Sequence[int] | None = None) -> dict[str, float]:
    """Accuracy, balanced accuracy and mean cross-entropy of `model` on `dataset`; with `classes`, over those
    classes only (a client-specific head: `restrict_logits`)."""
    model.eval()
    n = num_samples(dataset)
    if n == 0:
        return {"accuracy": float("nan"), "balanced_accuracy": float("nan"), "loss": float("nan"),
                "num_examples": 0}
    loss_sum, preds, labels = 0.0, [], []
    for x, y in in_order(dataset, batch_size):
        x, y = to_device(x, device), y.to(device)
        logits = restrict_logits(model(x), classes)
        loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        preds.append(logits.argmax(1).cpu().numpy())
        labels.append(y.cpu().numpy())
    y_true, y_pred = np.concatenate(labels), np.concatenate(preds)
    return {"accuracy": float((y_true == y_pred).mean()), "balanced_accuracy": balanced_accuracy(y_true, y_pred),
            "loss": loss_sum / n, "num_examples": n}
