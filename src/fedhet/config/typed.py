"""YAML values -> typed dataclasses: `from_dict` builds a config dataclass from a mapping, converting each value
to its field's annotated type, and names the key (and the nearest valid one) in every ConfigError."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from fedhet.errors import ConfigError, nearest
from fedhet.yaml_input import JSONDict

T = TypeVar("T")


def _coerce(value: Any, tp: Any, where: str) -> Any:  # Any: a YAML value and a typing annotation
    """Convert a YAML value to the annotated type, or raise a ConfigError naming the key."""
    origin = get_origin(tp)
    if tp is Any:  # Any: the typing form itself, compared at run time
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = get_args(tp)
        item_t = args[0] if args else Any  # Any: the typing form (an unparameterised list)
        items = [_coerce(v, item_t, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads '1e-3' (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: JSONDict, where: str = "") -> T:
    """Build dataclass `cls` from a mapping; unknown keys raise a ConfigError naming the nearest valid key."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"from_dict builds dataclasses; {cls!r} is not one")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: JSONDict = {}
    for key, value in data.items():
        full = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(
                f"unknown config key '{full}'{nearest(str(key), names)}; valid keys here: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)

