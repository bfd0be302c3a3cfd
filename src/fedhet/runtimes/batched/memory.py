"""How many lanes (client models) one vectorized step may hold: a memory estimate and the budget.

Per lane, a step keeps
  - tensors the size of the trainable parameters: the parameters, their gradients, the updated copy that
    `torch.where` selects from, the proximal anchor and the optimizer slots (SGD momentum: 1, Adam: 2),
    counted as `4 + slots` copies;
  - the buffers (BatchNorm statistics), twice (old and new);
  - activations: the outputs of every leaf module for one mini-batch, measured once with forward hooks on a
    single sample, times the batch size, times 3 (saved for backward, their gradients, and the temporaries
    of the functional BatchNorm and vmap's batching rules);
  - the stacked input batch.
This is an estimate (allocator slack and kernel workspaces are not counted), deliberately on the high side.

The budget is `run.batched_memory_mb` when set; else, on CUDA, 70 % of the free device memory at the start
of the run, and on CPU 25 % of the physical memory. `run.batched_max_clients` caps the number of clients per
chunk directly (both limits apply when both are set). A chunk always holds at least one client.
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

ACTIVATION_FACTOR = 3
MB = 1 << 20


def activation_numel(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Sum of the output sizes of every leaf module for one sample (measured with forward hooks, eval mode)."""
    total = 0

    def hook(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            device = next(iter(model.parameters())).device
            model(torch.zeros((1, *input_shape), device=device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return total


def lane_bytes(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, optimizer_slots: int) -> int:
    """Estimated bytes one lane needs during a step (see the module docstring)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    acts = activation_numel(model, input_shape) * batch_size * 4 * ACTIVATION_FACTOR
    inputs = math.prod(input_shape) * batch_size * 4
    return params * (4 + optimizer_slots) + 2 * buffers + acts + inputs


def default_budget_bytes(device: torch.device) -> int:
    """70 % of the free CUDA memory, or 25 % of the physical memory on CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(0.7 * free)
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        physical = 8 << 30
    return int(0.25 * physical)


def clients_per_chunk(per_lane: int, lanes_per_client: int, budget_bytes: int, max_clients: int | None) -> int:
    """The most clients whose lanes fit the budget (at least 1), capped by `max_clients`."""
    fit = max(1, budget_bytes // max(1, per_lane * lanes_per_client))
    return max(1, min(fit, max_clients)) if max_clients is not None else fit
