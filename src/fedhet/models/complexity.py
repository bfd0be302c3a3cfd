"""Parameter and multiply-accumulate (MAC) counts, by forward hooks on convolution and linear layers.

Conventions as in thop / ptflops: a Linear(i, o) costs i*o MACs per output row (bias not counted); a
convolution costs out_elements * (in_channels / groups) * prod(kernel_size).
Norms, activations and pooling are ignored.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def count_params(module: nn.Module, trainable_only: bool = False) -> int:
    """The number of parameters (optionally only those with requires_grad)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@torch.no_grad()
def count_params_and_macs(module: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, int]:
    """(parameters, MACs for one example of shape `input_shape`, without batch dimension).

    Runs one forward pass in eval mode on a zero input (batch 1) on the module's device; restores the mode.
    """
    macs = 0

    def hook(mod: nn.Module, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal macs
        if isinstance(mod, nn.Linear):
            macs += out.numel() // out.shape[-1] * mod.in_features * mod.out_features
        else:
            assert isinstance(mod, _CONV)
            macs += out.numel() * (mod.in_channels // mod.groups) * math.prod(mod.kernel_size)

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, (nn.Linear, *_CONV))]
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    was_training = module.training
    try:
        module.eval()
        module(torch.zeros((1, *input_shape), device=device))
    finally:
        module.train(was_training)
        for h in handles:
            h.remove()
    return count_params(module), int(macs)
