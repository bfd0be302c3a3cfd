"""Typed hyperparameter search spaces for FedPop (spec §2.9): dotted fedhet config keys -> typed dimensions.

A dimension is continuous (`uniform`, `log_uniform`, `one_minus_log`) or discrete (`choice`, `int`, `log2_int`).
Evo (Eq. 3) and the Delta-ball (§2.2) work on *positions*, not on config values:

* `uniform` [a, b]: the value itself;
* `log_uniform` [a, b]: log10 of the value, i.e. bounds are base-10 exponents ("log10 lr : U[-4, 0]");
* `one_minus_log` [a, b]: log10(1 - value), the paper's StepLR gamma ("log10(1 - gamma) : U[-4, -2]");
* discrete kinds: the index into an ordered grid (`choice` values as listed, `int` a..b inclusive, `log2_int`
  2^a..2^b, e.g. batch size 2^{3..7}), so "neighbouring values" are neighbouring indices.

An HP vector (`HPVector`) maps each key to its position. A `SearchSpace` holds two parts: `server` (alpha, Agg's
hyperparameters, Eq. 2) and `client` (beta, Loc's, Eq. 1). `parse_space` reads the YAML format of docs/tune.md;
checks against an experiment config (keys, roles, value ranges) are in `fedhet.tune.apply`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.config import deep_merge
from fedhet.errors import ConfigError, nearest
from fedhet.yaml_input import load_yaml, read_text

HPValue = Any  # Any: a hyperparameter's config value as YAML gives it (number, string, bool, None)

HPVector = dict[str, float]  # dotted config key -> position (log10 for log kinds, grid index for discrete kinds)

CONTINUOUS = ("uniform", "log_uniform", "one_minus_log")
DISCRETE = ("choice", "int", "log2_int")
KINDS = CONTINUOUS + DISCRETE
ROLES = ("server", "client")
_FIELDS = {"uniform": ("type", "low", "high", "scale"), "log_uniform": ("type", "low", "high", "scale"),
           "one_minus_log": ("type", "low", "high", "scale"), "int": ("type", "low", "high", "scale"),
           "log2_int": ("type", "low", "high", "scale"), "choice": ("type", "values", "scale")}


@dataclass(frozen=True)
class Dim:
    """One hyperparameter: its config key, kind, position bounds (continuous) or value grid (discrete), and the
    multiplier `scale` of its Evo step delta = (b - a) * eps * scale (Eq. 3)."""

    key: str
    kind: str
    low: float = 0.0  # continuous: lowest position (a); discrete: 0
    high: float = 0.0  # continuous: highest position (b); discrete: len(grid) - 1
    grid: tuple[HPValue, ...] = ()  # discrete: the ordered values
    scale: float = 1.0

    @property
    def discrete(self) -> bool:
        return self.kind in DISCRETE

    @property
    def width(self) -> float:
        """b - a of Eq. 3 in position units (the index range n - 1 for a discrete grid)."""
        return self.high - self.low

    def sample(self, rng: np.random.Generator) -> float:
        """A position drawn from the dimension's original distribution H_j (uniform over positions)."""
        if self.discrete:
            return int(rng.integers(len(self.grid)))
        return float(rng.uniform(self.low, self.high))

    def value(self, pos: float) -> HPValue:
        """The config value at position `pos`."""
        if self.discrete:
            return self.grid[int(pos)]
        if self.kind == "log_uniform":
            return float(10.0 ** pos)
        if self.kind == "one_minus_log":
            return float(1.0 - 10.0 ** pos)
        return float(pos)

    def position(self, value: HPValue) -> float:
        """The position of config value `value` (inverse of `value`); a ConfigError if it is off the space."""
        if self.discrete:
            if value not in self.grid:
                raise ConfigError(f"{self.key}={value!r} is not on its grid {list(self.grid)}")
            return self.grid.index(value)
        x = _number(value, f"{self.key}'s value")
        if self.kind in ("log_uniform", "one_minus_log"):
            inner = x if self.kind == "log_uniform" else 1.0 - x
            if inner <= 0:
                raise ConfigError(f"{self.key}={value!r} has no {self.kind} position (log10 of {inner})")
            return math.log10(inner)
        return x


@dataclass(frozen=True)
class Space:
    """The dimensions of one HP vector (alpha or beta), in a fixed order (the order of Evo's random draws)."""

    dims: dict[str, Dim] = field(default_factory=dict)

    def sample(self, rng: np.random.Generator) -> HPVector:
        """h ~ H: every coordinate drawn from its original distribution."""
        return {key: dim.sample(rng) for key, dim in self.dims.items()}

    def values(self, vec: Mapping[str, float]) -> dict[str, HPValue]:
        """{dotted key: config value} of an HP vector."""
        self.check(vec)
        return {key: dim.value(vec[key]) for key, dim in self.dims.items()}

    def check(self, vec: Mapping[str, float]) -> None:
        """A ConfigError unless `vec` has exactly this space's keys, each at a position inside its bounds."""
        if set(vec) != set(self.dims):
            raise ConfigError(f"HP vector keys {sorted(vec)} do not match the search space {sorted(self.dims)}")
        for key, dim in self.dims.items():
            pos = vec[key]
            inside = dim.low <= pos <= dim.high and (not dim.discrete or float(pos).is_integer())
            if not inside:
                raise ConfigError(f"HP vector {key}: position {pos} is outside [{dim.low}, {dim.high}]")


@dataclass(frozen=True)
class SearchSpace:
    """alpha (`server`, Agg, Eq. 2) and beta (`client`, Loc, Eq. 1); `joint` is Concat(alpha, beta)."""

    server: Space = field(default_factory=Space)
    client: Space = field(default_factory=Space)

    @property
    def joint(self) -> Space:
        return Space({**self.server.dims, **self.client.dims})

    def split(self, vec: Mapping[str, float]) -> tuple[HPVector, HPVector]:
        """(alpha, beta) of a joint vector."""
        return ({k: vec[k] for k in self.server.dims}, {k: vec[k] for k in self.client.dims})


def _number(raw: Any, where: str) -> float:  # Any: parsed YAML, checked here
    """A finite float from a YAML number (or a string such as '1e-3', which YAML 1.1 reads as text)."""
    if isinstance(raw, bool):
        raise ConfigError(f"{where} must be a number, got {raw!r}")
    try:
        x = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number, got {raw!r}") from None
    if not math.isfinite(x):
        raise ConfigError(f"{where} must be a finite number, got {raw!r}")
    return x


def _bounds(key: str, spec: Mapping[str, Any], integer: bool) -> tuple[float, float]:  # Any: parsed YAML
    """(low, high) of a range dimension: present, numeric (integers for int kinds) and low < high."""
    where = f"search space '{key}'"
    missing = [name for name in ("low", "high") if name not in spec]
    if missing:
        raise ConfigError(f"{where}: type {spec['type']} needs 'low' and 'high'; missing: {', '.join(missing)}")
    low, high = _number(spec["low"], f"{where}: low"), _number(spec["high"], f"{where}: high")
    if integer and not (low.is_integer() and high.is_integer()):
        raise ConfigError(f"{where}: type {spec['type']} needs integer bounds, got low={low:g}, high={high:g}")
    if low >= high:
        raise ConfigError(f"{where}: low ({low:g}) must be below high ({high:g}); swap them, or put a fixed value "
                          "in the experiment config instead of the search space")
    return low, high


def parse_dim(key: str, spec: Any) -> Dim:  # Any: parsed YAML, checked here
    """One dimension from its YAML mapping ({type, low, high} or {type: choice, values}, optional scale)."""
    where = f"search space '{key}'"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a mapping such as {{type: uniform, low: 0, high: 1}}, got {spec!r}")
    if "type" not in spec:
        raise ConfigError(f"{where}: missing 'type' (one of {', '.join(KINDS)})")
    kind = spec["type"]
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown type '{kind}'{nearest(str(kind), KINDS)}; valid: {', '.join(KINDS)}")
    for name in spec:
        if name not in _FIELDS[kind]:
            raise ConfigError(f"{where}: unknown field '{name}'{nearest(str(name), _FIELDS[kind])} for type {kind}; "
                              f"valid: {', '.join(_FIELDS[kind])}")
    scale = _number(spec.get("scale", 1.0), f"{where}: scale")
    if scale < 0:
        raise ConfigError(f"{where}: scale must be >= 0, got {scale:g}")
    if kind in CONTINUOUS:
        low, high = _bounds(key, spec, integer=False)
        return Dim(key, kind, low, high, scale=scale)
    if kind == "choice":
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: type choice needs a non-empty list 'values', got {values!r}")
        if len({repr(v) for v in values}) != len(values):
            raise ConfigError(f"{where}: choice values {values} repeat a value; list each value once")
        grid: tuple[HPValue, ...] = tuple(values)
    else:
        low, high = _bounds(key, spec, integer=True)
        if kind == "log2_int" and low < 0:
            raise ConfigError(f"{where}: log2_int bounds are exponents of 2 and must be >= 0, got low={low:g}")
        exps = range(int(low), int(high) + 1)
        grid = tuple(exps) if kind == "int" else tuple(2 ** e for e in exps)
    return Dim(key, kind, 0.0, float(len(grid) - 1), grid, scale)


def parse_space(data: Any) -> SearchSpace:  # Any: parsed YAML, checked here
    """A SearchSpace from a mapping {preset?, server: {key: dim}, client: {key: dim}} (docs/tune.md).

    `preset: NAME` starts from a named preset (`fedhet.tune.presets`); a dimension given below replaces the
    preset's (an entry without `type`, e.g. {scale: 2}, is merged into it) and `KEY: null` drops it.
    """
    from fedhet.tune.presets import preset_tree

    if not isinstance(data, Mapping):
        raise ConfigError(f"a search space must be a mapping with 'server' and/or 'client', got {data!r}")
    for name in data:
        if name not in ("preset", *ROLES):
            raise ConfigError(f"search space: unknown top-level key '{name}'{nearest(str(name), ('preset', *ROLES))}"
                              "; valid: preset, server, client")
    tree = preset_tree(str(data["preset"])) if data.get("preset") is not None else {"server": {}, "client": {}}
    for role in ROLES:
        part = data.get(role) or {}
        if not isinstance(part, Mapping):
            raise ConfigError(f"search space: '{role}' must map config keys to dimensions, got {part!r}")
        for key, spec in part.items():
            base = tree[role].get(key)
            if isinstance(spec, Mapping) and "type" not in spec and isinstance(base, dict):
                deep_merge(base, dict(spec))
            else:
                tree[role][key] = spec
    parts = {role: Space({str(k): parse_dim(str(k), v) for k, v in tree[role].items() if v is not None})
             for role in ROLES}
    both = set(parts["server"].dims) & set(parts["client"].dims)
    if both:
        raise ConfigError(f"search space: {sorted(both)} listed under both server and client; keep one")
    return SearchSpace(parts["server"], parts["client"])


def load_space(path: str | Path) -> SearchSpace:
    """Read a search-space YAML file (see `parse_space`)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"search-space file '{path}' not found")
    return parse_space(load_yaml(read_text(path, "search-space file"), f"search-space file '{path}'"))
