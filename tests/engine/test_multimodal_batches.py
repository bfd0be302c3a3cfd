"""Multimodal inputs (a list of tensors per batch) and per-client class pools in the engine's batching and
evaluation."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset

from fedhet.core.batches import batch_size, restrict_logits, to_device
from fedhet.engine.evaluation import evaluate


class PairData(Dataset):
    """((image, question), answer) samples, as a VQA dataset gives them."""

    def __init__(self, n: int = 6) -> None:
        self.images, self.questions = torch.randn(n, 3, 4, 4), torch.randint(2, 9, (n, 5))
        self.answers = torch.arange(n) % 3

    def __len__(self) -> int:
        return len(self.answers)

    def __getitem__(self, i: int):
        return (self.images[i], self.questions[i]), self.answers[i]


class PairModel(nn.Module):
    """Logits that always favour class 4 (outside every pool below), then the true answer (its question's
    first id mod 3, which the test's data makes equal to the answer)."""

    def forward(self, x):
        images, questions = x
        assert images.dim() == 4 and questions.dtype == torch.long
        logits = torch.zeros(len(images), 5)
        logits[torch.arange(len(images)), questions[:, 0] % 3] = 1.0
        logits[:, 4] = 2.0
        return logits


def test_to_device_and_batch_size_take_lists_of_tensors() -> None:
    x = [torch.ones(3, 2), torch.zeros(3, dtype=torch.long)]
    moved = to_device(x, torch.device("cpu"))
    assert isinstance(moved, list) and all(torch.equal(a, b) for a, b in zip(moved, x, strict=True))
    assert batch_size(x) == 3 and batch_size(torch.ones(7, 2)) == 7


def test_restrict_logits_masks_everything_outside_the_pool() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    out = restrict_logits(logits, (0, 2))
    assert out[0, 1] == float("-inf") and out[0, 2] == 1.0 and int(out.argmax()) == 2
    assert restrict_logits(logits, None) is logits


def test_evaluate_a_multimodal_dataset_over_a_client_pool() -> None:
    data = PairData()
    data.questions[:, 0] = data.answers  # the model's second choice is the right answer
    everything = evaluate(PairModel(), data, torch.device("cpu"), batch_size=4)
    pooled = evaluate(PairModel(), data, torch.device("cpu"), batch_size=4, classes=(0, 1, 2))
    assert everything["accuracy"] == 0.0  # class 4 wins without the pool
    assert pooled["accuracy"] == 1.0 and math.isfinite(pooled["loss"]) and pooled["num_examples"] == 6
