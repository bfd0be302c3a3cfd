"""Checkpoints: everything needed to resume bit-for-bit (round, server state, every client state, metrics).

Random streams need no saving: every random choice is re-derived from (seed, round, client), so restoring
the states at the end of round r and continuing with round r + 1 reproduces an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from fedhet.engine.atomic import atomic_torch_save
from fedhet.errors import CheckpointError

FORMAT = 1
IGNORED_SECTIONS = ("run", "name", "label", "sweep")  # do not change results; a resumed run may alter them
# Fault-tolerance settings: they change nothing while every client answers, a resumed run may alter them, and
# leaving them out keeps the fingerprints of checkpoints written before they existed.
IGNORED_SERVER_KEYS = ("min_fit_fraction", "min_evaluate_fraction", "reply_timeout")


def fingerprint(config: dict[str, Any]) -> str:
    """A hash of every config value that influences the results."""
    relevant = {k: v for k, v in config.items() if k not in IGNORED_SECTIONS}
    if isinstance(relevant.get("server"), dict):
        relevant["server"] = {k: v for k, v in relevant["server"].items() if k not in IGNORED_SERVER_KEYS}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(path: Path, *, config: dict[str, Any], round: int, server: dict, clients: dict,
                    metrics: list[dict], elapsed: float) -> None:
    """Write a checkpoint atomically (the previous file stays valid until the new one is complete)."""
    payload = {"format": FORMAT, "fingerprint": fingerprint(config), "method": config.get("method"),
               "round": round, "server": server, "clients": clients, "metrics": metrics, "elapsed": elapsed}
    atomic_torch_save(payload, path)


def load_checkpoint(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Read a checkpoint and check that it belongs to this config; raise CheckpointError otherwise."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise CheckpointError(
            f"checkpoint '{path}' is corrupt or unreadable ({type(err).__name__}: {err}). Nothing was "
            "overwritten; delete it to start over, or restore it from a copy.") from err
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a fedhet checkpoint (format {FORMAT}); nothing was overwritten.")
    if payload["fingerprint"] != fingerprint(config):
        raise CheckpointError(
            f"checkpoint '{path}' was written by a different config (method {payload.get('method')!r}); "
            "resume with the config of that run, or choose another run.out_dir/name. Nothing was overwritten.")
    return payload
