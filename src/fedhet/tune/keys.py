"""Which config keys a search space may hold, and when each is read (docs/tune.md, "Which keys can be tuned").

* per call: `train.*`, `server.*` and the method's `capabilities.call_params` are read inside the hooks each time,
  so a copy of the method (`algorithms.base.with_hparams`) takes them: they may differ per client and round.
* build time: every other `method_args.*` field and `model.args.*` are read when the method or its model is
  built (its shapes, its modules), so each member whose configuration sets them gets its own method and model
  built from its configuration (tune/member.py). They are one value per member: they go under `server:` (the
  member's alpha), and FedPop-G's replacement inherits them with its parent's weights (never perturbs them).
* anything else (`data.*`, `rounds`, `seed`, `run.*`, ...) is shared by every member or is not training: an error.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, get_type_hints

from fedhet.config import ExperimentConfig, ServerConfig, TrainConfig
from fedhet.errors import ConfigError, nearest

ROLE_SECTIONS = {"server": ("server", "method_args", "model.args"), "client": ("train", "method_args")}
_ROLE_NAMES = {"server": "a server (alpha, Agg)", "client": "a client (beta, Loc)"}
_WHY_NOT = {  # the keys no member can have its own value of, and why
    "data": "the data is loaded once and every member trains on the same clients and splits",
    "rounds": "it is each configuration's budget R_c, the same for every member",
    "seed": "the members share the run's random streams (a fair comparison needs the same draws)",
    "model": "the model's name, weights file and pretraining are shared; only model.args.* can differ per member",
    "method": "a tuning job tunes one method (tune each method on its own)",
    **dict.fromkeys(("run", "eval", "novel", "tune", "sweep", "name", "label", "imports", "stand_in"),
                    "it says how the job runs, is evaluated or is named, not how a member trains"),
}


def tunable_keys(cfg: ExperimentConfig) -> dict[str, Any]:  # Any: typing annotations (get_type_hints)
    """{dotted key: annotated type} of every tunable key: train.*, server.*, method_args.* of cfg.method and
    model.args.* of cfg.model.name (its factory's keyword-only arguments)."""
    from fedhet.algorithms.registry import ALGORITHMS
    from fedhet.models.base import MODELS, model_args

    sections: tuple[tuple[str, type], ...] = (("train", TrainConfig), ("server", ServerConfig),
                                             ("method_args", ALGORITHMS.get(cfg.method).Params))
    keys: dict[str, Any] = {}  # Any: as tunable_keys'
    for section, cls in sections:
        hints = get_type_hints(cls)
        keys.update({f"{section}.{f.name}": hints[f.name] for f in dataclasses.fields(cls)})
        for f in dataclasses.fields(cls):  # a dataclass-valued argument's fields, e.g. AdaptFED's update.lr
            if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name]):
                inner = get_type_hints(hints[f.name])
                keys.update({f"{section}.{f.name}.{g.name}": inner[g.name] for g in dataclasses.fields(hints[f.name])})
    factory_hints = get_type_hints(MODELS.get(cfg.model.name))
    # an unannotated argument: `object`, any value (check_kind has nothing to check)
    keys.update({f"model.args.{name}": factory_hints.get(name, object) for name in model_args(cfg.model.name)})
    return keys


def build_time(key: str, cfg: ExperimentConfig) -> bool:
    """Whether `key` is read when the method or model is built (one value per member, its own build)."""
    from fedhet.algorithms.registry import ALGORITHMS

    if key.startswith("model.args."):
        return True
    section, _, name = key.partition(".")
    return section == "method_args" and name not in ALGORITHMS.get(cfg.method).capabilities.call_params


def _section(key: str) -> str:
    return "model.args" if key.startswith("model.args.") else key.split(".")[0]


def check_key(role: str, key: str, cfg: ExperimentConfig, keys: Mapping[str, Any]) -> None:  # Any: as tunable_keys'
    """The key exists (else: why it cannot be tuned, or the nearest valid key) and belongs to `role`'s sections."""
    section = _section(key)
    if key not in keys:
        if section in _WHY_NOT:
            raise ConfigError(f"search space: '{key}' is not a tunable key: {_WHY_NOT[section]}; tune train.*, "
                              "server.*, method_args.* or model.args.* keys")
        hint, pool = "; keys look like train.lr, server.lr, method_args.NAME or model.args.NAME", list(keys)
        if section in ("method_args", "model.args"):
            pool = [k for k in keys if k.startswith(section + ".")]
            owner = f"method '{cfg.method}'" if section == "method_args" else f"model '{cfg.model.name}'"
            none = "no method arguments" if section == "method_args" else "no arguments"
            hint = f"; {owner} takes " + (", ".join(pool) if pool else none)
        raise ConfigError(f"search space: '{key}' is not a tunable key of this experiment{nearest(key, pool)}{hint}")
    if build_time(key, cfg) and role == "client":
        raise ConfigError(f"search space: '{key}' is read when the {_built(key)} is built, so it is one value per "
                          "member (its own build), not per client; list it under server:")
    if section not in ROLE_SECTIONS[role]:
        other = "client" if role == "server" else "server"
        raise ConfigError(f"search space: '{key}' is {_ROLE_NAMES[other]} hyperparameter; list it under "
                          f"{other}:, not {role}:")
    if key == "train.local_epochs" and cfg.train.local_steps is not None:
        raise ConfigError(f"search space: train.local_epochs is tuned but train.local_steps={cfg.train.local_steps} "
                          "overrides it; set train.local_steps=null or drop train.local_epochs from the space")
    if key == "server.momentum" and cfg.server.optimizer != "sgd":
        raise ConfigError(f"search space: server.momentum is tuned but server.optimizer={cfg.server.optimizer} "
                          "ignores it; set server.optimizer=sgd or drop server.momentum from the space")


def _built(key: str) -> str:
    return "model" if key.startswith("model.args.") else "method"


def check_kind(key: str, tp: Any, kind: str, discrete: bool) -> None:  # Any: a typing annotation
    """An int field needs a discrete dimension; a bool, text or Literal field a `choice`."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] \
        if typing.get_origin(tp) in (typing.Union, types.UnionType) else [tp]
    if args == [int] and not discrete:
        raise ConfigError(f"search space '{key}': the config value is an integer but type {kind} is "
                          "continuous; use type int, log2_int or choice")
    categorical = len(args) == 1 and (args[0] in (bool, str) or typing.get_origin(args[0]) is typing.Literal)
    if categorical and kind != "choice":
        raise ConfigError(f"search space '{key}': the config value is a {getattr(args[0], '__name__', 'choice')} "
                          f"but type {kind} is numeric; use type choice with the values to try")
