"""Split a model's parameters into P (personalised: generated per client by a hypernetwork) and xi (shared).

AdaptFED / TransFed (spec §1, §2.3) writes theta_i = (P_i, xi): P_i = h(phi; z_i) holds the focal-modulation
projections, xi everything else (FedAvg-ed). The paper does not say which tensors P is; our default preset
follows spec §2.5 [S]: the pre-projection `f` (emits q, ctx and the gates, the analogue of [P^Q, P^K, P^V]) and
the modulator `h` of every FocalModulation block. Table 9's alternatives are presets too. A spec is a preset
name, `type:ClassName` (every parameter inside modules of that class or a subclass) or a glob on parameter
names (`*.modulation.f.*`), or a list of these (their union). P keeps `model.named_parameters()` order, and
`groups` splits it by block (`block_pattern`), one hypernetwork output head per group (spec §2.4).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedhet.errors import ConfigError, nearest
from fedhet.models.base import NORM_TYPES

BLOCK_PATTERN = r"^(.*?\b(?:blocks\.\d+|stem|downsample))\."

Selector = Callable[[nn.Module], Iterator[str]]


def _children_params(owner_class: str | tuple[str, ...], children: Sequence[str]) -> Selector:
    """The parameters of the named children of every module whose class is `owner_class` (or one of them)."""
    owners = (owner_class,) if isinstance(owner_class, str) else owner_class

    def select(model: nn.Module) -> Iterator[str]:
        for name, module in model.named_modules():
            if type(module).__name__ in owners:
                for child in children:
                    sub = getattr(module, child, None)
                    if isinstance(sub, nn.Module):
                        prefix = f"{name}.{child}." if name else f"{child}."
                        yield from (prefix + n for n, _ in sub.named_parameters())
    return select


def _modules_params(match: Callable[[str, nn.Module], bool]) -> Selector:
    """Every parameter inside the modules `match(name, module)` accepts."""
    def select(model: nn.Module) -> Iterator[str]:
        for name, module in model.named_modules():
            if match(name, module):
                yield from ((f"{name}.{n}" if name else n) for n, _ in module.named_parameters())
    return select


def _class_names(module: nn.Module) -> set[str]:
    return {cls.__name__ for cls in type(module).__mro__}


FOCAL_MODULATIONS = ("FocalModulation", "CausalFocalModulation")  # timm FocalNet's, focal_sequence's (1-D)
PRESETS: dict[str, tuple[str, Selector]] = {
    "focal_modulation": ("each FocalModulation's f and h (spec §2.5; the default)",
                         _children_params(FOCAL_MODULATIONS, ("f", "h"))),
    "focal_modulation_proj": ("each FocalModulation's f, h and proj (spec §2.5's optional proj)",
                              _children_params(FOCAL_MODULATIONS, ("f", "h", "proj"))),
    "attention_qkv": ("each self-attention block's qkv projection (FedTP / the TransFed code's to_qkv; model vit)",
                      _children_params("Attention", ("qkv",))),
    "mlp": ("every block MLP (timm Mlp, or a module named 'mlp'; Table 9 'MLP Layers')",
            _modules_params(lambda n, m: "Mlp" in _class_names(m) or n.rsplit(".", 1)[-1] == "mlp")),
    "norm": ("every normalization layer: LayerNorm (incl. LayerNorm2d), GroupNorm, BatchNorm (Table 9)",
             _modules_params(lambda n, m: isinstance(m, NORM_TYPES))),
    "encoder": ("the patch embeddings: FocalNet's stem and stage downsampling, or a PatchEmbed (Table 9 "
                "'Encoder', our reading)", _modules_params(lambda n, m: type(m).__name__ in ("Downsample",
                                                                                           "PatchEmbed"))),
}
SYNTAX = "'type:ClassName' or a glob on parameter names (e.g. '*.modulation.f.*')"


@dataclass(frozen=True)
class ParamPartition:
    """P and xi parameter names (named_parameters order), P's shapes, and P's names grouped by block."""

    p: tuple[str, ...]
    xi: tuple[str, ...]
    p_shapes: tuple[torch.Size, ...]
    groups: tuple[tuple[str, ...], ...]
    group_keys: tuple[str, ...]

    @property
    def p_numel(self) -> int:
        """The number of scalars in P (D_s, the hypernetwork's output size, spec §2.3)."""
        return sum(int(s.numel()) for s in self.p_shapes)

    def shapes(self) -> dict[str, torch.Size]:
        """P's names -> shapes, in P's order."""
        return dict(zip(self.p, self.p_shapes, strict=True))

    def p_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's P parameters by name, in P's order."""
        params = dict(model.named_parameters())
        return {n: params[n] for n in self.p}

    def xi_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's xi parameters by name, in xi's order."""
        params = dict(model.named_parameters())
        return {n: params[n] for n in self.xi}


def _valid_choices() -> str:
    return f"presets {', '.join(PRESETS)}, or {SYNTAX}"


def _select(model: nn.Module, item: str, names: Sequence[str]) -> set[str]:
    """The parameter names one spec item selects; a ConfigError for unknown presets or empty matches."""
    if item in PRESETS:
        chosen = set(PRESETS[item][1](model))
    elif item.startswith("type:"):
        cls = item[len("type:"):]
        chosen = set(_modules_params(lambda n, m: cls in _class_names(m))(model))
    elif any(ch in item for ch in "*?[.") or item in names:
        chosen = {n for n in names if fnmatch.fnmatchcase(n, item)}
    else:
        raise ConfigError(f"unknown parameter-partition preset '{item}'{nearest(item, PRESETS)}; "
                          f"valid: {_valid_choices()}")
    if not chosen:
        raise ConfigError(f"partition selector '{item}' matches no parameter of {type(model).__name__} "
                          f"(its parameters look like {', '.join(names[:3])}, ...); valid: {_valid_choices()}")
    return chosen


def _group_key(name: str, block: re.Pattern[str]) -> str:
    found = block.match(name)
    return found.group(1) if found else name.rsplit(".", 1)[0]


def split_parameters(model: nn.Module, spec: str | Sequence[str] = "focal_modulation",
                     block_pattern: str = BLOCK_PATTERN) -> ParamPartition:
    """theta = (P, xi): P = the union of `spec`'s selections, xi = every other parameter (spec §1, §7a.1).

    `block_pattern` (a regex whose group 1 is a block's name prefix) groups P by block; a P tensor outside
    any block is its own module's group. Unknown presets, selectors that match nothing and an empty spec are
    one ConfigError listing the valid choices.
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    if not items or not all(isinstance(i, str) and i for i in items):
        raise ConfigError(f"parameter partition spec must name at least one selector; valid: {_valid_choices()}")
    named = list(model.named_parameters())
    names = [n for n, _ in named]
    chosen: set[str] = set()
    for item in items:
        chosen |= _select(model, item, names)
    p = tuple(n for n in names if n in chosen)
    block = re.compile(block_pattern)
    keys: dict[str, list[str]] = {}
    for n in p:
        keys.setdefault(_group_key(n, block), []).append(n)
    return ParamPartition(
        p=p, xi=tuple(n for n in names if n not in chosen),
        p_shapes=tuple(t.shape for n, t in named if n in chosen),
        groups=tuple(tuple(v) for v in keys.values()), group_keys=tuple(keys))
