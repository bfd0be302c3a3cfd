"""Intermediate features by module name (forward hooks), for feature-space penalties (Ditto-MMD, MOON-style).

    logits, feats = forward_with_features(model, x, ["features.0", "features"])   # feats[name]: (B, -1)

Hooks are registered for one forward pass and removed right after, so a model never carries hooks between
calls (models are reused buffers and also used for evaluation and checkpointing). Each captured output is
flattened to (batch, -1), as FL4Health's FeatureExtractorBuffer does; gradients flow through it. A module's output
is captured as returned: an in-place op applied to it later in the forward (e.g. ``nn.ReLU(inplace=True)``)
would change it, so name the activation module itself when post-activation features are wanted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from fedhet.errors import ConfigError, nearest


def check_layers(model: nn.Module, layers: Sequence[str]) -> None:
    """Raise a ConfigError naming the nearest module when a layer name is not a submodule of `model`."""
    names = [n for n, _ in model.named_modules() if n]
    for layer in layers:
        if layer not in names:
            raise ConfigError(f"layer '{layer}' is not a module of the model{nearest(layer, names)}; "
                              f"modules: {', '.join(names[:40])}")


def forward_with_features(model: nn.Module, x: torch.Tensor, layers: Sequence[str]
                          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward pass of `model` on `x`: (output, {layer: that module's output flattened to (B, -1)})."""
    modules = dict(model.named_modules())
    captured: dict[str, torch.Tensor] = {}
    handles: list[RemovableHandle] = []

    def hook_for(name: str) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def hook(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
            captured[name] = output.flatten(1)
        return hook

    try:
        for layer in layers:
            if layer not in modules or not layer:
                check_layers(model, [layer])
            handles.append(modules[layer].register_forward_hook(hook_for(layer)))
        out = model(x)
    finally:
        for h in handles:
            h.remove()
    missing = [layer for layer in layers if layer not in captured]
    if missing:
        raise RuntimeError(f"layers {missing} were not called in the model's forward pass")
    return out, {layer: captured[layer] for layer in layers}
