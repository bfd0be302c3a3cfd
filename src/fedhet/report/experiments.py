"""Which runs are seeds of one experiment: a report averages only runs whose configs agree on every key that
can change the results, apart from the seed.

Runs that share a (dataset, label) but differ elsewhere (another model, another number of rounds, another
learning rate) become separate columns, each labelled with the keys that tell it apart ("fedavg [rounds=4]"),
and the report says so. Not compared, because they do not make another experiment: the seed, the names
(`name`, `label`, `stand_in`), `sweep`, the whole `run` section (folders, threads, runtime: the same experiment
computed another way), `data.root` / `data.download` (where the data lives) and `imports`. Compared, unlike a
resume's fingerprint (engine.checkpoint): `rounds` (a 4-round and a 6-round run are not seeds of one
experiment) and `tune` (a tuning job's settings are its experiment).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from fedhet.config import ExperimentConfig, flatten
from fedhet.report.runs import RunRecord
from fedhet.yaml_input import JSONDict

IGNORED_PREFIXES = ("run.", "sweep.", "data.root", "data.download")
IGNORED_KEYS = {"seed", "name", "label", "stand_in", "imports", "sweep", "run"}
_DEFAULTS = flatten(ExperimentConfig().to_dict())


def experiment_keys(config: JSONDict) -> JSONDict:
    """The dotted config keys that make an experiment, a missing key counting as its default (a run written
    before fedhet had the key ran with the behaviour its default keeps)."""
    merged = {**_DEFAULTS, **flatten(config)}
    return {k: v for k, v in merged.items()
            if k not in IGNORED_KEYS and not k.startswith(IGNORED_PREFIXES)}


def _identity(keys: JSONDict) -> str:
    return json.dumps(keys, sort_keys=True, default=str)


def _short(value: Any) -> str:  # Any: a config value (parsed YAML)
    text = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def split_experiments(runs: Sequence[RunRecord]) -> list[RunRecord]:
    """`runs` with the label of every run that shares its (dataset, label) with another experiment extended by
    the keys in which the experiments differ, e.g. "fedbn [model.name=small_cnn]". Idempotent."""
    buckets: dict[tuple[str, str], dict[str, JSONDict]] = {}
    for run in runs:
        keys = experiment_keys(run.config)
        buckets.setdefault((run.dataset, run.label), {})[_identity(keys)] = keys
    out = []
    for run in runs:
        experiments = buckets[(run.dataset, run.label)]
        if len(experiments) == 1:
            out.append(run)
            continue
        keys = experiment_keys(run.config)
        differing = sorted(k for k in set().union(*experiments.values())
                           if len({_identity({k: e.get(k)}) for e in experiments.values()}) > 1)
        suffix = ", ".join(f"{k}={_short(keys.get(k))}" for k in differing)
        out.append(dataclasses.replace(run, label=f"{run.label} [{suffix}]"))
    return out


def split_note(before: Sequence[RunRecord], after: Sequence[RunRecord]) -> str:
    """A sentence naming the (dataset, label) groups that were split, '' when none was."""
    split = sorted({(a.dataset, a.label) for a, b in zip(before, after, strict=True) if a.label != b.label})
    if not split:
        return ""
    names = "; ".join(f"{label} on {dataset}" for dataset, label in split)
    return (f"**Not averaged together.** Runs of {names} differ in more than the seed, so each experiment is its "
            "own column, labelled with the keys that differ (rounds included: runs of different lengths are "
            "never seeds of one experiment).\n")
