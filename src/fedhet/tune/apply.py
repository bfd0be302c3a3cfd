"""Search spaces meet experiment configs: `check_space` validates a space against one experiment (keys, roles,
value types and ranges, with the config's own nearest-key errors), `apply_vector` turns an HP vector into a normal
run config through the same overrides `fedhet run key=value` takes, and `vector_to_dict` / `vector_from_dict` /
`to_overrides` write and read vectors as YAML-able data.

Roles: a `server` (alpha, Agg, Eq. 2) key lives in `server.*`, `method_args.*` or `model.args.*`; a `client`
(beta, Loc, Eq. 1) key in `train.*` or a per-call `method_args.*`. Which keys are tunable, and which are read when
the method or model is built (one value per member, its own build): `fedhet.tune.keys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from fedhet.config import ExperimentConfig, ServerConfig, TrainConfig, load_config, set_path
from fedhet.errors import ConfigError
from fedhet.tune.keys import check_key, check_kind, tunable_keys
from fedhet.tune.space import HPValue, HPVector, SearchSpace, Space


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
    sections, fits its field's type (an int field needs a discrete dimension, a bool or text field a choice), and
    every value the dimension can reach is accepted by the config's own validation (`model.args.*` values are
    checked when the members' models are built: tune/member.py)."""
    keys = tunable_keys(cfg)
    for role, part in (("server", space.server), ("client", space.client)):
        for key, dim in part.dims.items():
            check_key(role, key, cfg, keys)
            check_kind(key, keys[key], dim.kind, dim.discrete)
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
