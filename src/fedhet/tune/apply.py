"""Search spaces meet experiment configs: `check_space` validates a space against one experiment (keys, roles,
value types and ranges, with the config's own nearest-key errors), `apply_vector` turns an HP vector into a normal
run config through the same overrides `fedhet run key=value` takes, and `vector_to_dict` / `vector_from_dict` /
`to_overrides` write and read vectors as YAML-able data.

Roles: a `server` (alpha, Agg, Eq. 2) key lives in `server.*` or `method_args.*`; a `client` (beta, Loc, Eq. 1)
key in `train.*` or `method_args.*`. Every key must be a field of its section or of the method's `Params`.
`model.args.*` (e.g. dropout) is refused: the model is built once, with the same arguments for every client and
configuration, so such a value could not take effect.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, get_type_hints

import yaml

from fedhet.config import ExperimentConfig, ServerConfig, TrainConfig, load_config, set_path
from fedhet.errors import ConfigError, nearest
from fedhet.tune.space import HPValue, HPVector, SearchSpace, Space

ROLE_SECTIONS = {"server": ("server", "method_args"), "client": ("train", "method_args")}
_ROLE_NAMES = {"server": "a server (alpha, Agg)", "client": "a client (beta, Loc)"}


def tunable_keys(cfg: ExperimentConfig) -> dict[str, Any]:  # Any: typing annotations (get_type_hints)
    """{dotted key: annotated type} of every checked tunable key: train.*, server.*, method_args.* of cfg.method."""
    from fedhet.algorithms.registry import ALGORITHMS

    sections: tuple[tuple[str, type], ...] = (("train", TrainConfig), ("server", ServerConfig),
                                             ("method_args", ALGORITHMS.get(cfg.method).Params))
    keys: dict[str, Any] = {}  # Any: as tunable_keys'
    for section, cls in sections:
        hints = get_type_hints(cls)
        keys.update({f"{section}.{f.name}": hints[f.name] for f in dataclasses.fields(cls)})
    return keys


def _is_int(tp: Any) -> bool:  # Any: a typing annotation
    """Whether a field annotation is int or int | None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args == [int]
    return bool(tp is int)


def _check_key(role: str, key: str, cfg: ExperimentConfig, keys: Mapping[str, Any]) -> None:  # Any: as tunable_keys'
    """The key exists (else: the nearest valid key) and belongs to `role`'s sections."""
    section = key.split(".")[0]
    if section == "model":
        raise ConfigError(f"search space: '{key}' is a model argument, read once when the model is built and the "
                          "same for every client and configuration; fedhet tune cannot vary it (tune train.*, "
                          "server.* or per-call method_args.* keys)")
    if key not in keys:
        hint, pool = "; keys look like train.lr, server.lr or method_args.NAME", list(keys)
        if section == "method_args":
            pool = [k for k in keys if k.startswith("method_args.")]
            hint = f"; method '{cfg.method}' takes " + (", ".join(pool) if pool else "no method arguments")
        raise ConfigError(f"search space: '{key}' is not a tunable key of this experiment{nearest(key, pool)}{hint}")
    if section not in ROLE_SECTIONS[role]:
        other = "client" if role == "server" else "server"
        raise ConfigError(f"search space: '{key}' is {_ROLE_NAMES[other]} hyperparameter; list it under "
                          f"{other}:, not {role}:")
    if section == "method_args":
        from fedhet.algorithms.registry import ALGORITHMS

        per_call = ALGORITHMS.get(cfg.method).capabilities.call_params
        if key.split(".")[1] not in per_call:
            raise ConfigError(f"search space: method '{cfg.method}' reads {key} when it is built, so it cannot "
                              f"differ per client or member; its per-call method_args: "
                              f"{', '.join(sorted(per_call)) or 'none'}")
    if key == "train.local_epochs" and cfg.train.local_steps is not None:
        raise ConfigError(f"search space: train.local_epochs is tuned but train.local_steps={cfg.train.local_steps} "
                          "overrides it; set train.local_steps=null or drop train.local_epochs from the space")
    if key == "server.momentum" and cfg.server.optimizer != "sgd":
        raise ConfigError(f"search space: server.momentum is tuned but server.optimizer={cfg.server.optimizer} "
                          "ignores it; set server.optimizer=sgd or drop server.momentum from the space")


def _check_values(space: Space, key: str, cfg: ExperimentConfig) -> None:
    """Every value the dimension can take at its ends (every grid value) is a valid config value."""
    from fedhet.engine.experiment import method_params

    dim = space.dims[key]
    positions = range(len(dim.grid)) if dim.discrete else (dim.low, dim.high)
    for pos in positions:
        value = dim.value(pos)
        try:
            tree = cfg.to_dict()
            set_path(tree, key, value)
            checked = load_config(base=tree)
            if key.startswith("method_args."):
                method_params(checked)
        except ConfigError as err:
            raise ConfigError(f"search space '{key}': the value {value!r} it can take is not valid here: {err}; "
                              "narrow its bounds") from err


def check_space(space: SearchSpace, cfg: ExperimentConfig) -> None:
    """Validate `space` for experiment `cfg`: each key exists (nearest valid key otherwise), sits in its role's
    sections, fits its field's type (an int field needs a discrete dimension), and every value the dimension
    can reach is accepted by the config's own validation."""
    keys = tunable_keys(cfg)
    for role, part in (("server", space.server), ("client", space.client)):
        for key, dim in part.dims.items():
            _check_key(role, key, cfg, keys)
            if _is_int(keys.get(key)) and not dim.discrete:
                raise ConfigError(f"search space '{key}': the config value is an integer but type {dim.kind} is "
                                  "continuous; use type int, log2_int or choice")
            _check_values(part, key, cfg)


def apply_vector(cfg: ExperimentConfig, space: Space, vec: Mapping[str, float]) -> ExperimentConfig:
    """`cfg` with the HP vector's values set as overrides, loaded and validated like `fedhet run ... key=value`.

    For a member's full configuration pass `search.joint` and Concat(alpha, beta) = {**alpha, **beta}.
    """
    tree = cfg.to_dict()
    for key, value in space.values(vec).items():
        set_path(tree, key, value)
    return load_config(base=tree)


def hparams_of(cfg: ExperimentConfig, space: Space, vec: Mapping[str, float]
               ) -> tuple[TrainConfig, ServerConfig, Any]:  # Any: the method's own Params dataclass
    """(train, server, method Params) of `cfg` with the HP vector applied and validated: what
    `algorithms.base.with_hparams` takes for one client (beta^k) or one member (alpha)."""
    from fedhet.engine.experiment import method_params

    applied = apply_vector(cfg, space, vec)
    return applied.train, applied.server, method_params(applied)


def vector_to_dict(space: Space, vec: Mapping[str, float]) -> dict[str, HPValue]:
    """{dotted key: config value} with plain Python values (safe for yaml.safe_dump / JSON)."""
    return {key: _plain(value) for key, value in space.values(vec).items()}


def vector_from_dict(space: Space, values: Mapping[str, HPValue]) -> HPVector:
    """The HP vector of {dotted key: config value} (inverse of `vector_to_dict`); ConfigError if off the space."""
    if set(values) != set(space.dims):
        raise ConfigError(f"HP values {sorted(values)} do not match the search space {sorted(space.dims)}")
    vec = {key: dim.position(values[key]) for key, dim in space.dims.items()}
    space.check(vec)
    return vec


def to_overrides(space: Space, vec: Mapping[str, float]) -> list[str]:
    """The vector as `key=value` strings for `fedhet run` (values written so YAML reads them back unchanged)."""
    return [f"{key}={_scalar(value)}" for key, value in vector_to_dict(space, vec).items()]


def _plain(value: HPValue) -> HPValue:
    """Numpy scalars -> Python scalars."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def _scalar(value: HPValue) -> str:
    """One YAML scalar on one line (1e-05 is written 1.0e-05, which YAML 1.1 reads as a float)."""
    return str(yaml.safe_dump(value, default_flow_style=True, width=1 << 30)).removesuffix("\n...\n").strip()
