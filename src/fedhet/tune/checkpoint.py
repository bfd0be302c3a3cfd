"""A tuning population's checkpoint: `<run>/checkpoints/population.pt`, written atomically after every round
(the previous file stays valid until the new one is complete), read with the engine's trusted loader (tensors,
plain data and fedhet's state classes only: nothing in it can run code). The tuner's random draws are re-derived
from (seed, round, slot), so the members, the round and the counts are all a resume needs to continue exactly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fedhet.atomic import atomic_torch_save
from fedhet.config import ExperimentConfig
from fedhet.engine.checkpoint import ConfigValue, config_differences
from fedhet.engine.safe_load import load_trusted
from fedhet.errors import CheckpointError
from fedhet.tune.fedex import FedExState
from fedhet.tune.fedpop import Tried
from fedhet.tune.member import Member
from fedhet.yaml_input import JSONDict

FORMAT = 2  # 2: the config itself (was its hash), compared as a plain run's resume compares it
FILENAME = "population.pt"


def tuning_differences(old: JSONDict, cfg: ExperimentConfig) -> dict[str, tuple[ConfigValue, ConfigValue]]:
    """What differs between the config a population checkpoint was written with and `cfg`: the experiment's
    results-relevant keys (as a plain run's resume checks them), the rounds (R_c sets T_g and the annealing)
    and the tune section."""
    new = cfg.to_dict()
    differences = config_differences(old, new)
    for key in ("rounds", "tune"):
        if old.get(key) != new.get(key):
            differences[key] = (old.get(key), new.get(key))
    return differences


@dataclasses.dataclass
class SavedPopulation:
    """What a population checkpoint holds besides the config: the last finished round, the members, the tried
    vectors, the best member's metric rows, the seconds spent, the round in which every configuration
    diverged (tuning ended there; None: it did not) and the members trained in each DP round (tune/privacy.py)."""

    round: int
    members: list[Member]
    tried: Tried
    rows: list[JSONDict]
    elapsed: float
    halted: int | None = None
    dp_rounds: list[int] = dataclasses.field(default_factory=list)


def save_population(path: Path, cfg: ExperimentConfig, saved: SavedPopulation) -> None:
    """Write the population after round `saved.round` (members as plain fields; tried vectors as sorted lists)."""
    tried = saved.tried
    payload = {"kind": "population", "format": FORMAT, "config": cfg.to_dict(), "round": saved.round,
               "members": [_plain(m) for m in saved.members],
               "tried": {"alphas": sorted(tried.alphas), "betas": sorted(tried.betas)}, "rows": saved.rows,
               "elapsed": saved.elapsed, "halted": saved.halted, "dp_rounds": list(saved.dp_rounds)}
    atomic_torch_save(payload, path)


def load_population(path: Path, cfg: ExperimentConfig) -> SavedPopulation:
    """The population checkpoint at `path`, made with this same tuning config (one written before `halted` was
    stored reads as not halted)."""
    if not path.exists():
        raise CheckpointError(f"--resume: no population checkpoint at '{path}'; run without --resume to start")
    payload = load_trusted(path, "population checkpoint")
    if not isinstance(payload, dict) or payload.get("kind") != "population" or payload.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a fedhet population checkpoint (format {FORMAT})")
    differences = tuning_differences(payload["config"], cfg)
    if differences:
        listed = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in differences.items())
        raise CheckpointError(f"the population checkpoint in '{path.parent.parent}' was made with another config "
                              f"({listed}); resume with the same config, or start again with --overwrite")
    members = [Member(**{**m, "fedex": FedExState(**m["fedex"]) if m.get("fedex") else None})
               for m in payload["members"]]
    seen = payload["tried"]
    tried = Tried(alphas={_key(v) for v in seen["alphas"]}, betas={_key(v) for v in seen["betas"]})
    halted = payload.get("halted")
    return SavedPopulation(int(payload["round"]), members, tried, list(payload["rows"]), float(payload["elapsed"]),
                           None if halted is None else int(halted), [int(k) for k in payload.get("dp_rounds", [])])


def _plain(member: Member) -> dict[str, Any]:  # Any: the member's fields, torch-saved
    """A member's fields, its FedEx state as a plain mapping (the trusted loader reads no other classes)."""
    fields = {f.name: getattr(member, f.name) for f in dataclasses.fields(member)}
    return fields | {"fedex": dataclasses.asdict(member.fedex) if member.fedex is not None else None}


def _key(pairs: list[Any]) -> tuple[tuple[str, float], ...]:  # Any: (key, value) pairs from torch.load
    """A tried vector's key as `Tried` holds it (the checkpoint may hand back lists for tuples)."""
    return tuple((str(k), float(v)) for k, v in pairs)
