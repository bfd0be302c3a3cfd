"""Checkpoints: everything needed to resume bit-for-bit (round, server state, every client state, metrics).

Random streams need no saving: every random choice is re-derived from (seed, round, client), so restoring
the states at the end of round r and continuing with round r + 1 reproduces an uninterrupted run.

A checkpoint carries the *results-relevant* part of its config (`relevant_config`) and a hash of it. A resume
must present the same values, with two exceptions (docs/design.md, "What a resume may change"):
- `rounds` may grow past the checkpoint's round (extending a run): schedules that depend on the total number
  of rounds (FRAug's λ_syn, λ_c) follow the new total from the next round on;
- keys the user names in `allow_changes` (`--allow-config-change KEY[,KEY...]`), e.g. `train.lr` after a NaN loss.
Both are recorded in the checkpoint's `config_changes` (and in summary.json).

Left out of the comparison, because they do not change the numbers: `name`, `label`, `sweep`, `data.download`,
`run.out_dir`, `run.checkpoint_every`, `run.quiet`, the `novel` adaptation settings (only which clients
are held out counts), the batched runtime's chunking (`run.batched_*`) and the
Flower fault-tolerance settings of `server`. Part of it: `run.runtime` as its family (in-process and Flower
compute the same numbers; the batched runtime matches them only to float tolerance), `run.device` as the
device type it resolves to (cpu / cuda), and `run.num_threads` (torch's CPU kernels split sums differently
with another thread count: 1 vs 2 threads gave weights 2e-3 apart after 3 rounds of the quickstart's CNN).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from fedhet.atomic import atomic_torch_save
from fedhet.config import ExperimentConfig, flatten
from fedhet.core.contract import ServerState
from fedhet.engine.executor import ClientStates
from fedhet.engine.safe_load import UntrustedFileError, load_trusted
from fedhet.errors import CheckpointError
from fedhet.yaml_input import JSONDict

FORMAT = 3  # 3: typed client / server states (contract v2)
Payload = dict[str, Any]  # Any: a checkpoint as torch.load returns it (states, metric rows, config)
ConfigValue = Any  # Any: a flattened config's leaf, any YAML scalar or list
IGNORED_SECTIONS = ("name", "label", "stand_in", "sweep", "tune", "rounds")
IGNORED_DATA_KEYS = ("download",)
# Fault-tolerance settings: they change nothing while every client answers, and a resumed run may alter them.
IGNORED_SERVER_KEYS = ("min_fit_fraction", "min_evaluate_fraction", "reply_timeout")
RUNTIME_FAMILY = {"inprocess": "sequential", "flower": "sequential", "flower-simulation": "sequential",
                  "batched": "batched"}


def _device_type(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name.split(":")[0]


def relevant_config(config: JSONDict) -> JSONDict:
    """The config values that influence the results (everything a resume must keep the same)."""
    relevant = {k: v for k, v in config.items() if k not in IGNORED_SECTIONS and k not in ("run", "novel")}
    if ((config.get("privacy") or {}).get("dp") or {}).get("mode", "off") == "off":
        relevant.pop("privacy", None)  # no DP: fingerprints as before the section existed (pretraining caches)
    novel = config.get("novel") or {}
    if novel.get("holdout") or novel.get("clients"):  # who trains; the adaptation settings act after training
        relevant["novel"] = {"holdout": novel.get("holdout"), "clients": novel.get("clients")}
    if isinstance(relevant.get("server"), dict):
        relevant["server"] = {k: v for k, v in relevant["server"].items() if k not in IGNORED_SERVER_KEYS}
    if isinstance(relevant.get("data"), dict):
        relevant["data"] = {k: v for k, v in relevant["data"].items() if k not in IGNORED_DATA_KEYS}
    run = config.get("run", {})
    relevant["run"] = {"runtime": RUNTIME_FAMILY.get(run.get("runtime", "inprocess"), run.get("runtime")),
                       "device": _device_type(str(run.get("device", "auto"))), "num_threads": run.get("num_threads")}
    return relevant


def _digest(relevant: JSONDict) -> str:
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint(config: JSONDict) -> str:
    """A hash of every config value that influences the results (`rounds` excluded: a run may be extended)."""
    return _digest(relevant_config(config))


def config_differences(old: JSONDict, new: JSONDict) -> dict[str, tuple[ConfigValue, ConfigValue]]:
    """Dotted key -> (checkpoint's value, this config's value) for every results-relevant key that differs. A key
    added to fedhet after the checkpoint was written counts as its default there (the run used the behaviour
    the default keeps), so it differs only when this config sets it away from the default."""
    a, b = flatten(relevant_config(old)), flatten(relevant_config(new))
    default = flatten(relevant_config(ExperimentConfig().to_dict()))
    then = {k: a[k] if k in a else default.get(k) for k in set(a) | set(b)}
    return {k: (then[k], b.get(k)) for k in sorted(then) if then[k] != b.get(k)}


def save_checkpoint(path: Path, *, config: JSONDict, round: int, server: ServerState, clients: ClientStates,
                    metrics: list[JSONDict], elapsed: float,
                    config_changes: list[JSONDict] | None = None,
                    traffic: dict[str, float] | None = None) -> None:
    """Write a checkpoint atomically (the previous file stays valid until the new one is complete). `traffic`:
    the last trained round's per-client traffic, for the summary of a run resumed after its last round."""
    payload = {"format": FORMAT, "fingerprint": fingerprint(config), "method": config.get("method"),
               "config": config, "round": round, "server": server, "clients": clients, "metrics": metrics,
               "elapsed": elapsed, "config_changes": list(config_changes or []), "traffic": dict(traffic or {})}
    atomic_torch_save(payload, path)


def _refusal(path: Path, differences: dict[str, tuple[ConfigValue, ConfigValue]]) -> CheckpointError:
    listed = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in differences.items())
    keys = ",".join(differences)
    hint = ""
    if "run.runtime" in differences:
        hint = " (the batched runtime matches the in-process one only to float tolerance, not bit for bit)"
    return CheckpointError(
        f"checkpoint '{path}' was written by a different config: {listed}{hint}. Resume with the checkpoint's "
        f"values, or accept the change with --resume --allow-config-change {keys}, or start again with "
        "--overwrite. Nothing was overwritten.")


def _read(path: Path) -> Payload:
    try:
        payload = load_trusted(path, f"checkpoint '{path}'")
    except UntrustedFileError:
        raise
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise CheckpointError(
            f"checkpoint '{path}' is corrupt or unreadable ({type(err).__name__}: {err}). Nothing was "
            "overwritten; delete it (or pass --overwrite) to start over, or restore it from a copy.") from err
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "config" not in payload:
        raise CheckpointError(f"'{path}' is not a fedhet checkpoint of format {FORMAT} (an older fedhet or another "
                              "program wrote it); start again with --overwrite. Nothing was overwritten.")
    return payload


def load_checkpoint(path: Path, config: JSONDict, allow_changes: tuple[str, ...] = ()) -> Payload:
    """Read a checkpoint and check that it belongs to this config (see the module docstring); raise a
    CheckpointError naming every differing key with both values otherwise. The returned payload's
    `config_changes` has the accepted changes of this resume appended."""
    payload = _read(path)
    differences = config_differences(payload["config"], config)
    unknown = [k for k in allow_changes if k not in flatten(relevant_config(config)) and k != "rounds"]
    if unknown:
        raise CheckpointError(f"--allow-config-change {','.join(unknown)}: not a results-relevant config key "
                              "(keys look like train.lr or method_args.mu)")
    refused = {k: v for k, v in differences.items() if k not in allow_changes}
    if refused:
        raise _refusal(path, refused)
    rounds = int(config.get("rounds", 0))
    if rounds < payload["round"]:
        raise CheckpointError(f"checkpoint '{path}' is at round {payload['round']}, beyond rounds={rounds}: "
                              f"resume with rounds >= {payload['round']}. Nothing was overwritten.")
    changes = dict(differences)
    if payload["config"].get("rounds") != config.get("rounds"):
        changes["rounds"] = (payload["config"].get("rounds"), config.get("rounds"))
    payload["config_changes"] = list(payload.get("config_changes", [])) + [
        {"round": payload["round"], "key": k, "old": a, "new": b} for k, (a, b) in changes.items()]
    return payload
