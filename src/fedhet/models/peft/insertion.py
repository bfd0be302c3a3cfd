"""Insert `DualAdapter`s after the FFN output of every transformer block of any HF-style encoder.

The adapter becomes a child `fedhet_adapter` of the target module and a forward hook maps that module's output
h to `adapter(h)`; the backbone's own parameter names do not change, so load pretrained weights before or after
inserting (with `strict=False` before, as the adapter keys are new). Targets:

- "auto" (default): the child `output` of every module that has both an `intermediate` and an `output` child --
  `ViltOutput`, `BertOutput` (MiniLM), `RobertaOutput`, `ViTOutput`, fedhet's `VLOutput`. Its output is the FFN
  sub-layer's result with its residual (and, in post-LN encoders such as BERT, its LayerNorm: the "normalized
  output of FFN" of Eq. 1).
- a class name ("ViltOutput") or a pattern matched against the end of qualified module names, where `*` is one
  name part and `**` any number ("encoder.layer.*.output"); "encoder.layer.*.output.dense" puts the adapter on
  the FFN's second projection, before the residual (Houlsby's position).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fedhet.errors import ConfigError
from fedhet.models.peft.adapters import SLOTS, DualAdapter

ADAPTER_ATTR = "fedhet_adapter"


def module_types(model: nn.Module, limit: int = 25) -> str:
    """The distinct class names in `model`, in order of appearance (for error messages)."""
    seen = list(dict.fromkeys(type(m).__name__ for m in model.modules()))
    return ", ".join(seen[:limit]) + (", ..." if len(seen) > limit else "")


def name_matches(name: str, pattern: str) -> bool:
    """Whether qualified `name` ends with `pattern` at a dot; `*` is one name part, `**` any number."""
    parts = (re.escape(t).replace(r"\?", "[^.]") for t in pattern.split("**"))
    body = ".*".join(p.replace(r"\*", "[^.]*") for p in parts)
    return re.fullmatch(rf"(?:.*\.)?{body}", name) is not None


def _matches(name: str, module: nn.Module, patterns: Sequence[str]) -> bool:
    return any(type(module).__name__ == p or name_matches(name, p) for p in patterns)


def find_ffn_outputs(model: nn.Module, target: str | Sequence[str] = "auto") -> list[tuple[str, nn.Module]]:
    """The (qualified name, module) pairs adapters go after; a ConfigError when nothing matches."""
    if target == "auto":
        found = [(f"{n}.output" if n else "output", m.get_submodule("output")) for n, m in model.named_modules()
                 if isinstance(getattr(m, "intermediate", None), nn.Module)
                 and isinstance(getattr(m, "output", None), nn.Module)]
        if not found:
            raise ConfigError(f"{type(model).__name__} has no transformer blocks (no module with both "
                              f"'intermediate' and 'output' children); module types found: {module_types(model)}")
        return found
    patterns = [target] if isinstance(target, str) else list(target)
    found = [(n, m) for n, m in model.named_modules() if n and _matches(n, m, patterns)]
    if not found:
        raise ConfigError(f"unknown adapter insertion target {patterns}: no module type or name matches; "
                          f"module types found: {module_types(model)}")
    return found


def _hidden_size(name: str, module: nn.Module, hidden_size: int | None) -> int:
    if hidden_size is not None:
        return int(hidden_size)
    for m in (module, getattr(module, "dense", None)):
        if isinstance(m, nn.Linear):
            return int(m.out_features)
    norm = getattr(module, "LayerNorm", None)
    if isinstance(norm, nn.LayerNorm):
        return int(norm.normalized_shape[-1])
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if linears:  # e.g. an MLP's last projection (fc2, down_proj, wo)
        return int(linears[-1].out_features)
    raise ConfigError(f"cannot tell the hidden size after module '{name}' ({type(module).__name__}); "
                      "pass hidden_size=")


def _adapter_hook(module: nn.Module, args: Any, output: Any) -> Any:  # Any: hook args / output
    adapter = getattr(module, ADAPTER_ATTR)
    if isinstance(output, tuple):
        return (adapter(output[0]), *output[1:])
    return adapter(output)


def insert_adapters(model: nn.Module, target: str | Sequence[str] = "auto", reduction: int = 16, *,
                    dual: bool = True, bias: bool = True, init: str = "bert",
                    dat_weights: tuple[float, float] = (0.5, 0.5), hidden_size: int | None = None) -> list[str]:
    """Put a `DualAdapter` (A_s; with dual=True also Â_s and A_c) after every target; returns their names.

    Adapters are drawn from the global torch RNG (seed it first) on each target's device and dtype; the path
    starts as "shared". Raises a ConfigError if reduction does not divide d or a target already has adapters.
    """
    targets = find_ffn_outputs(model, target)
    for name, module in targets:
        if hasattr(module, ADAPTER_ATTR):
            raise ConfigError(f"module '{name}' already has adapters; insert them once")
        d = _hidden_size(name, module, hidden_size)
        ref = next(module.parameters(), None)
        kw: dict[str, Any] = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}  # Any: torch kwargs
        module.add_module(ADAPTER_ATTR, DualAdapter(d, reduction, dual=dual, bias=bias, init=init,
                                                    dat_weights=dat_weights, **kw))
        module.register_forward_hook(_adapter_hook)
    return [n for n, _ in targets]


def adapter_modules(model: nn.Module) -> list[tuple[str, DualAdapter]]:
    """The (qualified name, DualAdapter) pairs of `model`, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, DualAdapter)]


def _adapters(model: nn.Module) -> list[DualAdapter]:
    found = [m for _, m in adapter_modules(model)]
    if not found:
        raise ConfigError(f"{type(model).__name__} has no adapters; call insert_adapters(model) first")
    return found


def set_adapter_path(model: nn.Module, path: str) -> None:
    """Route every adapter of `model` through `path` ("shared", "dat", "client", "frozen_shared", "none")."""
    for adapter in _adapters(model):
        adapter.set_path(path)


def get_adapter_path(model: nn.Module) -> str:
    """The path of the model's adapters (they are always set together)."""
    return _adapters(model)[0].path


@contextmanager
def adapter_path(model: nn.Module, path: str) -> Iterator[None]:
    """`with adapter_path(model, "dat"): z_dat = model(x)` -- restores the previous path afterwards."""
    previous = get_adapter_path(model)
    set_adapter_path(model, path)
    try:
        yield
    finally:
        set_adapter_path(model, previous)


def refresh_frozen_copy(model: nn.Module) -> None:
    """Â_s <- A_s in every block (Alg. 1: the frozen copy of the received shared adapter)."""
    for adapter in _adapters(model):
        adapter.refresh_frozen()


def _slot_check(slot: str) -> None:
    if slot not in SLOTS:
        raise ConfigError(f"unknown adapter slot {slot!r}; valid: {', '.join(SLOTS)}")


def adapter_named_parameters(model: nn.Module, slot: str) -> list[tuple[str, nn.Parameter]]:
    """(qualified name, parameter) of adapter slot `slot` in every block; names match model.state_dict()."""
    _slot_check(slot)
    marker = f".slots.{slot}."
    return [(n, p) for n, p in model.named_parameters() if f"{ADAPTER_ATTR}{marker}" in n]


def adapter_parameters(model: nn.Module, slot: str) -> list[nn.Parameter]:
    """The parameters of slot `slot` ("shared" = A_s, "client" = A_c, "frozen_shared" = Â_s), e.g. for AdamW."""
    return [p for _, p in adapter_named_parameters(model, slot)]


def adapter_state(model: nn.Module, slot: str) -> dict[str, torch.Tensor]:
    """Detached copies of slot `slot`'s tensors keyed by their model.state_dict() names."""
    return {n: p.detach().clone() for n, p in adapter_named_parameters(model, slot)}


def load_adapter_state(model: nn.Module, slot: str, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` (as from `adapter_state`, same slot) into slot `slot`; a ConfigError on missing keys."""
    params = dict(adapter_named_parameters(model, slot))
    if set(params) != set(state):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise ConfigError(f"adapter state for slot {slot!r} does not match: missing {missing[:3]}, "
                          f"unexpected {extra[:3]}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name])
