"""fedhet's experiment config as Flower run-config keys, so `flwr run APP --run-config "train.lr=0.05"` works.

Flower's run config is flat: `[tool.flwr.app.config]` in the App's pyproject.toml, values bool / int / float /
str. fedhet's nested config becomes dotted keys (`train.lr`, `data.alpha`, `method_args.mu`, the method's
defaults written out so each can be overridden). A value is read back the way a `key=value` override is on
fedhet's command line: numbers and bools as they are, a string as YAML (so `data.domains = "[mnist, usps]"` is a
list, `train.grad_clip = "null"` is None); a plain string that YAML would read as something else is written
quoted. Then the whole tree is validated like any config: a wrong type or value, or a key fedhet does not know,
is one ConfigError naming it (and the nearest valid key). Flower itself refuses `--run-config` keys the App's
pyproject does not list ("Key ... is not present in the main dictionary").

Besides the experiment, the run config holds the runtime settings (`run-dir`, `resume`, ..., RUNTIME_KEYS) and
three Flower-style aliases with the experiment's values: `num-server-rounds` (rounds), `lr` (train.lr),
`local-epochs` (train.local_epochs), so a stock Flower ClientApp that reads them (as Flower's quickstarts do) trains
as the experiment says. ALIAS_WRITTEN records the values the App was written with: an alias changed by
`--run-config` sets its key; changing an alias and its key to different values is an error. (Apps written before
that key existed used 0 for "not set".)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fedhet.config import flatten as dotted
from fedhet.config import load_config
from fedhet.config.loading import set_path
from fedhet.errors import ConfigError
from fedhet.yaml_input import JSONDict, load_yaml

RunConfigValue = bool | int | float | str
RUNTIME_KEYS: dict[str, type] = {"run-dir": str, "wait-for-nodes": float, "poll-interval": float,
                                 "client-state-dir": str, "resume": bool, "stop-after": int, "partition-query": bool,
                                 "node-data": bool, "per-run-dir": bool, "resume-from": str}
ALIASES = {"num-server-rounds": "rounds", "lr": "train.lr", "local-epochs": "train.local_epochs"}
ALIAS_WRITTEN = "fedhet-aliases-written"  # JSON {alias: value} of the App as written (not an experiment key)
APP_DIR = "fedhet-app-dir"  # node_app.APP_DIR_KEY: the App folder, added for a worker (not an experiment key)


def encode(value: Any) -> RunConfigValue:  # Any: a config value as parsed from YAML
    """One config value as a Flower run-config value (see the module docstring)."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if _yaml(value) == value else json.dumps(value)
    return json.dumps(value)  # None, lists, empty mappings: JSON is YAML


def _yaml(text: str) -> Any:  # Any: parsed YAML
    try:
        return load_yaml(text, "a run-config value")
    except ConfigError:
        return None


def flatten(tree: JSONDict) -> dict[str, RunConfigValue]:
    """Nested config -> {dotted key: run-config value}; an empty mapping stays one key (`method_args = "{}"`)."""
    return {key: encode(value) for key, value in dotted(tree).items()}


def experiment_run_config(config: JSONDict) -> dict[str, RunConfigValue]:
    """The run-config keys of a resolved experiment config, the method's arguments with their defaults."""
    from fedhet.engine.experiment import method_params

    full = {**config, "method_args": dataclasses.asdict(method_params(load_config(base=config)))}
    flat = flatten(full)
    aliases = {alias: flat[target] for alias, target in ALIASES.items()}
    return {**flat, **aliases, ALIAS_WRITTEN: json.dumps(aliases)}


def read_run_config(run_config: JSONDict) -> tuple[JSONDict, JSONDict]:
    """(resolved experiment config, runtime settings) from a Flower run config (flat, as Flower hands it to the
    apps, or nested as in pyproject.toml); ConfigError naming a bad key."""
    run_config = dotted(run_config)
    runtime = {k: _runtime(k, run_config[k]) for k in RUNTIME_KEYS if k in run_config}
    tree: JSONDict = {}
    for key, value in run_config.items():
        if key in RUNTIME_KEYS or key in ALIASES or key in (ALIAS_WRITTEN, APP_DIR):
            continue
        set_path(tree, key, _yaml_value(key, value))
    _apply_aliases(run_config, tree)
    if not tree:
        raise ConfigError("the Flower run config holds no fedhet experiment keys (method, rounds, train.lr, ...); "
                          "write the App with `fedhet flower app CONFIG` or list the keys in [tool.flwr.app.config]")
    known = ", ".join([*RUNTIME_KEYS, *ALIASES])
    try:
        cfg = load_config(base=tree)
    except ConfigError as err:
        raise ConfigError(f"Flower run config: {err} (runtime keys: {known})") from None
    return cfg.to_dict(), runtime


def _apply_aliases(run_config: JSONDict, tree: JSONDict) -> None:
    """Set the key of every alias the user changed from the value the App was written with (module docstring)."""
    written = json.loads(run_config[ALIAS_WRITTEN]) if isinstance(run_config.get(ALIAS_WRITTEN), str) else {}
    for alias, target in ALIASES.items():
        if alias not in run_config:
            continue
        value = _yaml_value(alias, run_config[alias])
        before = written.get(alias, 0)  # an App without the record wrote 0 for "not set"
        if value in (None, "") or value == before:
            continue
        mine = dotted(tree).get(target, before)
        if written and mine not in (before, value):
            raise ConfigError(f"the run config changes both {alias} ({before} -> {value}) and {target} "
                              f"({before} -> {mine}); set one of them")
        set_path(tree, target, value)


def _yaml_value(key: str, value: Any) -> Any:  # Any: a run-config value, parsed YAML
    if isinstance(value, str):
        return load_yaml(value, f"run-config key '{key}'", fix="write it as the value of a fedhet override, "
                         "e.g. data.domains=\"[mnist, usps]\"") if value != "" else ""
    return value


def _runtime(key: str, value: Any) -> Any:  # Any: a run-config value, checked here
    kind = RUNTIME_KEYS[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"Flower run config: '{key}' must be a {kind.__name__}, got {value!r}")
    return value
