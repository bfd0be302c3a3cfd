"""Which entries of a model's state are shared: selection by layer *type*, not by name (FedBN done right)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

BN_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm,)

StateDict = dict[str, torch.Tensor]
OptimState = dict[str, Any]  # Any: a torch optimizer's state_dict, a nested tree of tensors, numbers and lists


def keys_of_types(model: nn.Module, types: tuple[type[nn.Module], ...]) -> set[str]:
    """State-dict keys (parameters AND buffers) owned directly by modules of the given types."""
    keys: set[str] = set()
    for mod_name, module in model.named_modules():
        if isinstance(module, types):
            prefix = f"{mod_name}." if mod_name else ""
            keys.update(prefix + k for k in module.state_dict(keep_vars=True) if "." not in k)
    return keys


def keys_under(model: nn.Module, submodule: str) -> set[str]:
    """State-dict keys below a named submodule (e.g. 'head')."""
    return {k for k in model.state_dict() if k == submodule or k.startswith(submodule + ".")}


def select(state: StateDict, keys: Iterable[str]) -> StateDict:
    """The entries of `state` whose keys are in `keys`, detached and cloned."""
    keys = set(keys)
    return {k: v.detach().clone() for k, v in state.items() if k in keys}


def state_of(model: nn.Module, keys: Iterable[str] | None = None) -> StateDict:
    """A detached CPU copy of (part of) a model's state dict."""
    wanted = set(keys) if keys is not None else None
    if wanted is not None and not wanted:
        return {}  # no state_dict() walk for nothing (FedAvg's local part, once per client and round)
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()
            if wanted is None or k in wanted}


def load_partial(model: nn.Module, state: StateDict) -> None:
    """Copy the given entries into the model in place; every key must exist in the model."""
    own = model.state_dict()
    unknown = set(state) - set(own)
    if unknown:
        raise KeyError(f"keys not in model: {sorted(unknown)[:5]}")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)


@contextmanager
def frozen(params: Iterable[nn.Parameter]) -> Iterator[None]:
    """Set requires_grad=False on the given parameters for the block, then restore their flags."""
    saved = [(p, p.requires_grad) for p in params]
    for p, _ in saved:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)
