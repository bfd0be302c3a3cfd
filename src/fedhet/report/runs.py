"""Reading run directories written by the engine: `config.yaml`, `metrics.jsonl`, `summary.json`."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedhet.errors import FedhetError
from fedhet.yaml_input import JSONDict

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
_SUMMARY_KEYS = ("method", "dataset", "seed", "final")
_ROW_KEYS = ("round", "client", "split")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricRow:
    """One line of metrics.jsonl: a client's (or "avg") metrics on a split after a round."""

    round: int
    client: str
    split: str
    values: dict[str, float]
    num_examples: int | None = None


@dataclass
class RunRecord:
    """A finished (or interrupted) run: its config, per-round metrics and final summary."""

    path: Path
    method: str
    dataset: str
    seed: int
    final: dict[str, dict[str, float]]
    rounds_completed: int | None = None
    wall_time_s: float | None = None
    name: str | None = None
    label: str = ""  # the variant's label (config `label`); the method name when the run has none
    rounds: int | None = None  # planned rounds (config.yaml)
    config: JSONDict = field(default_factory=dict)
    summary: JSONDict = field(default_factory=dict)
    metrics: list[MetricRow] = field(default_factory=list)

    @property
    def clients(self) -> list[str]:
        """Clients in the final summary, in file order ("avg" included if present)."""
        return list(self.final)

    def curve(
        self, metric: str = "accuracy", client: str = "avg", split: str = "test"
    ) -> tuple[list[int], list[float]]:
        """(rounds, values) of `metric` for `client` on `split`, sorted by round (last row wins on repeats)."""
        points: dict[int, float] = {}
        for row in self.metrics:
            if row.client == client and row.split == split and metric in row.values:
                points[row.round] = row.values[metric]
        rounds = sorted(points)
        return rounds, [points[r] for r in rounds]


def _read_json(path: Path) -> Any:  # Any: parsed JSON
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FedhetError(f"corrupt JSON in {path} (line {e.lineno}, column {e.colno}): {e.msg}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise FedhetError(f"cannot read {path}: {e}") from e


def _as_float(value: Any, where: str) -> float:  # Any: a JSON value, checked here
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value is None:
            return math.nan
        raise FedhetError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _read_metrics(path: Path) -> list[MetricRow]:
    rows: list[MetricRow] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise FedhetError(f"cannot read {path}: {e}") from e
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):  # a run killed mid-write leaves a truncated last line: drop it, with a word
                log.warning("%s line %d is truncated (%s); it is left out, so the curves end at the line before",
                            path, i, e.msg)
                break
            raise FedhetError(f"corrupt JSON in {path} line {i}: {e.msg}; repair or delete that line") from e
        if not isinstance(obj, dict) or any(k not in obj for k in _ROW_KEYS):
            raise FedhetError(f"{path} line {i}: expected an object with keys {', '.join(_ROW_KEYS)}")
        where = f"{path} line {i}"
        values = {
            k: _as_float(v, f"{where} '{k}'")
            for k, v in obj.items()
            if k not in (*_ROW_KEYS, "num_examples") and not isinstance(v, (str, list, dict))
        }
        n = obj.get("num_examples")
        rows.append(
            MetricRow(
                round=int(obj["round"]),
                client=str(obj["client"]),
                split=str(obj["split"]),
                values=values,
                num_examples=int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else None,
            )
        )
    return rows


def _warn_short_metrics(path: Path, metrics: list[MetricRow], completed: Any) -> None:  # Any: a JSON value
    """Warn when metrics.jsonl is missing or ends before the round the summary says was completed."""
    if not isinstance(completed, int) or isinstance(completed, bool) or completed < 1:
        return
    if not (path / METRICS).is_file():
        log.warning("%s is missing: the report has the final numbers but no learning curve for this run",
                    path / METRICS)
        return
    last = max((r.round for r in metrics), default=0)
    if last < completed:
        log.warning("%s ends at round %d but %s says %d rounds were completed (a truncated file?); the curves "
                    "end at round %d", path / METRICS, last, SUMMARY, completed, last)


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True if `path` is a directory holding a summary.json."""
    return (Path(path) / SUMMARY).is_file()


def _read_summary(path: Path) -> tuple[JSONDict, dict[str, dict[str, float]]]:
    """summary.json of run dir `path` and its final metrics (client -> metric -> value)."""
    summary = _read_json(path / SUMMARY)
    if not isinstance(summary, dict):
        raise FedhetError(f"{path / SUMMARY}: expected a JSON object")
    missing = [k for k in _SUMMARY_KEYS if k not in summary]
    if missing:
        raise FedhetError(f"{path / SUMMARY} lacks key(s) {', '.join(missing)}")
    final_raw = summary["final"]
    if not isinstance(final_raw, dict) or not all(isinstance(v, dict) for v in final_raw.values()):
        raise FedhetError(f"{path / SUMMARY}: 'final' must map client -> {{metric: value}}")
    final = {
        str(client): {k: _as_float(v, f"{path / SUMMARY} final.{client}.{k}") for k, v in metrics.items()}
        for client, metrics in final_raw.items()
    }
    return summary, final


def _read_config(path: Path) -> JSONDict:
    """config.yaml of run dir `path` ({} when there is none)."""
    if not (path / CONFIG).is_file():
        return {}
    try:
        loaded = yaml.safe_load((path / CONFIG).read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as e:
        problem = " ".join(str(e).split())
        raise FedhetError(f"corrupt YAML in {path / CONFIG} ({problem}); repair it, or delete it (the report "
                          "then lacks the run's name and planned rounds)") from e
    if loaded is not None and not isinstance(loaded, dict):
        raise FedhetError(f"{path / CONFIG}: expected a mapping at top level")
    return loaded or {}


def _opt_int(value: Any) -> int | None:  # Any: a JSON value, checked here
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def load_run(path: str | os.PathLike[str]) -> RunRecord:
    """Parse a run directory; a FedhetError says what is missing or corrupt.

    summary.json is required; config.yaml and metrics.jsonl are read when present (a truncated last line of
    metrics.jsonl, as left by a killed run, is ignored).
    """
    path = Path(path)
    if not path.is_dir():
        raise FedhetError(f"run directory {path} does not exist or is not a directory")
    if not (path / SUMMARY).is_file():
        raise FedhetError(
            f"{path} is not a run directory: it has no {SUMMARY} (the engine writes it when a run ends; "
            f"expected {CONFIG}, {METRICS}, {SUMMARY})"
        )
    summary, final = _read_summary(path)
    config = _read_config(path)
    metrics = _read_metrics(path / METRICS) if (path / METRICS).is_file() else []
    _warn_short_metrics(path, metrics, summary.get("rounds_completed"))
    try:
        seed = int(summary["seed"])
    except (TypeError, ValueError) as e:
        raise FedhetError(f"{path / SUMMARY}: seed must be an integer, got {summary['seed']!r}") from e
    wall = summary.get("wall_time_s")
    return RunRecord(
        path=path,
        method=str(summary["method"]),
        dataset=str(summary["dataset"]),
        seed=seed,
        final=final,
        rounds_completed=_opt_int(summary.get("rounds_completed")),
        wall_time_s=float(wall) if isinstance(wall, (int, float)) and not isinstance(wall, bool) else None,
        name=str(config["name"]) if config.get("name") is not None else None,
        label=str(summary.get("label") or config.get("label") or summary["method"]),
        rounds=_opt_int(config.get("rounds")),
        config=config,
        summary=summary,
        metrics=metrics,
    )


def find_run_dirs(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Run directories among `paths`: each is a run dir or a parent searched recursively for summary.json.

    Parents' runs are returned sorted by path; duplicates are dropped; the order of `paths` is kept.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FedhetError(f"{p} does not exist")
        dirs = [p] if is_run_dir(p) else sorted(s.parent for s in p.rglob(SUMMARY) if s.is_file())
        for d in dirs:
            key = d.resolve()
            if key not in seen:
                seen.add(key)
                found.append(d)
    return found


def load_runs(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[RunRecord]:
    """`load_run` for every run directory found by `find_run_dirs`; FedhetError if there is none."""
    dirs = find_run_dirs(paths)
    if not dirs:
        raise FedhetError(f"no run directories (with {SUMMARY}) found under {paths}")
    return [load_run(d) for d in dirs]
