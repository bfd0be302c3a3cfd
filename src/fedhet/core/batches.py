"""A batch's inputs: one tensor, or several for a multimodal sample (e.g. VQA's image and question ids, collated
by the DataLoader into a list of tensors); and logits restricted to a client's own classes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

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
