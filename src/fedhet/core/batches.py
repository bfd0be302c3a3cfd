"""A batch's inputs: one tensor, or several for a multimodal sample (e.g. VQA's image and question ids, collated
by the DataLoader into a list of tensors); logits restricted to a client's own classes; how many mini-batches a
local pass has (`num_steps`, used by the engine's batching and by methods whose schedules span a pass)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedhet.config import TrainConfig

Inputs = torch.Tensor | Sequence[torch.Tensor]


def to_device(x: Inputs, device: torch.device, non_blocking: bool = False) -> Inputs:
    """`x` (a tensor, or a list / tuple of tensors) on `device`."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=non_blocking)
    return type(x)(t.to(device, non_blocking=non_blocking) for t in x)  # type: ignore[call-arg]


def batch_size(x: Inputs) -> int:
    """The number of samples in `x` (the first dimension of its first tensor)."""
    return int((x if isinstance(x, torch.Tensor) else x[0]).shape[0])


def restrict_logits(logits: torch.Tensor, classes: Sequence[int] | None) -> torch.Tensor:
    """Logits with every class outside `classes` at -inf (a client-specific head over its own answer pool, as a
    C^k-way classifier); `classes` None: unchanged."""
    if classes is None:
        return logits
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[list(classes)] = True
    return logits.masked_fill(~keep, float("-inf"))


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
