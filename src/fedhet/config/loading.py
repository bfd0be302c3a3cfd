"""Reading a config: YAML files with their `extends` chain, `key=value` overrides, then typed and validated."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_origin, get_type_hints

from fedhet.config.examples import find_config
from fedhet.config.experiment import ExperimentConfig
from fedhet.config.typed import from_dict
from fedhet.errors import ConfigError
from fedhet.yaml_input import JSONDict, load_yaml, read_text


def flatten(tree: JSONDict, prefix: str = "") -> JSONDict:
    """{'train': {'lr': 0.1}} -> {'train.lr': 0.1}."""
    out: JSONDict = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def set_path(tree: JSONDict, dotted: str, value: Any) -> None:  # Any: a YAML value
    """Set tree['a']['b'] = value for dotted key 'a.b', creating mappings on the way."""
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{key}' is not a section")
        node = child
    node[keys[-1]] = value


def _check_override_path(dotted: str) -> None:
    """Every dotted part but the last must name a section (a dataclass or a mapping), e.g. not `rounds.x`."""
    tp: Any = ExperimentConfig  # Any: a typing annotation, walked down the dataclasses
    keys = dotted.split(".")
    for i, key in enumerate(keys[:-1]):
        if not dataclasses.is_dataclass(tp):
            return  # a free-form mapping (method_args, model.args, sweep): anything goes
        hints = get_type_hints(tp)
        if key not in hints:
            return  # from_dict names the unknown key and the nearest valid one
        tp = hints[key]
        if not dataclasses.is_dataclass(tp) and get_origin(tp) is not dict and tp not in (dict, Any):  # Any: typing
            where = ".".join(keys[: i + 1])
            raise ConfigError(f"override '{dotted}': '{where}' is not a section but a single value; "
                              f"write {where}=VALUE")


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:  # Any: parsed YAML values
    """Parse `key=value` strings; values are read as YAML scalars (so `lr=0.1` is a float).

    An empty key part (`=1`, `train..lr=1`) or a value that is not valid YAML is a ConfigError. A key may repeat
    here (the last one wins, so lists of overrides compose in code); the command line refuses a repeated key
    (`fedhet.cli_args.check_repeated_overrides`).
    """
    parsed: list[tuple[str, Any]] = []  # Any: as above
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. train.lr=0.05)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not all(key.split(".")):
            raise ConfigError(f"override '{item}' has an empty key or an empty part between dots; "
                              "write section.key=value, e.g. train.lr=0.05")
        value = load_yaml(raw, f"the value of override '{item}'",
                          fix="quote it for a plain string, e.g. 'name=\"a: b\"'") if raw != "" else None
        parsed.append((key, value))
    return parsed


def _read_config_tree(path: Path, seen: tuple[Path, ...]) -> JSONDict:
    """The YAML mapping of `path` with its `extends` chain resolved (base first, then this file).

    An empty file (nothing but blanks or comments) is an error: `{}` says "the built-in defaults" explicitly.
    """
    where = f" (extended by '{seen[-1]}')" if seen else ""
    if not path.exists():
        raise ConfigError(f"config file '{path}'{where} not found; see configs/ for examples (`fedhet configs` "
                          "lists the ones shipped with fedhet; run one by name, e.g. `fedhet run quickstart`)")
    if path.resolve() in seen:
        raise ConfigError(f"config file '{path}' extends itself through: {' -> '.join(map(str, seen))}")
    loaded = load_yaml(read_text(path, "config file"), f"config file '{path}'{where}")
    if loaded is None:
        raise ConfigError(f"config file '{path}'{where} is empty (no keys, only blanks or comments); put the "
                          "settings in it (see configs/ for examples), or write {} to run the built-in defaults")
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at the top level")
    if "imports" in loaded:  # a relative .py path: this file's folder first, then the current directory
        from fedhet.plugins import anchor_imports  # here: importing the config (and the contract) stays light

        loaded["imports"] = anchor_imports(loaded["imports"], path.parent)
    parent = loaded.pop("extends", None)
    if parent is None:
        return loaded
    if not isinstance(parent, str):
        raise ConfigError(f"config file '{path}': extends must be a file path, got {parent!r}")
    tree = _read_config_tree(path.parent / parent, (*seen, path.resolve()))
    deep_merge(tree, loaded)
    return tree


def deep_merge(tree: JSONDict, extra: JSONDict) -> None:
    """Merge `extra` into `tree`: nested dicts key by key, anything else replaced."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            deep_merge(tree[key], value)
        else:
            tree[key] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: JSONDict | None = None) -> ExperimentConfig:
    """Read a YAML config (or start from `base`), apply overrides, validate and return it.

    A file may start from another one with `extends: <path relative to this file>`: the other file is read
    first (it may extend a third) and this file's values are merged into it key by key, so a table's config
    names only what differs from its base (e.g. `sweep`). A relative `path` that does not exist may name an
    example config shipped with fedhet (`quickstart`, `configs/quickstart.yaml`; `fedhet.config.examples`).
    """
    parsed = parse_overrides(overrides or [])  # a malformed override is reported before the file is read
    tree: JSONDict = dict(base or {})
    if path is not None:
        deep_merge(tree, _read_config_tree(find_config(path), ()))
    for key, value in parsed:
        _check_override_path(key)
        set_path(tree, key, value)
    cfg = from_dict(ExperimentConfig, tree)
    cfg.validate()
    return cfg
