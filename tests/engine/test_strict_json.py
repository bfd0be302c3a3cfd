"""Every JSON file a run writes is JSON that any parser reads: no bare NaN / Infinity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedhet.atomic import strict_json
from fedhet.engine.rundir import RunDirectory


def _strict_loads(text: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"non-JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_become_null() -> None:
    obj = {"a": math.nan, "b": [1.0, math.inf, -math.inf], "c": {"d": 0.5, "e": (math.nan, 2)}, "f": "NaN"}
    assert _strict_loads(strict_json(obj)) == {"a": None, "b": [1.0, None, None], "c": {"d": 0.5, "e": [None, 2]},
                                               "f": "NaN"}


def test_summary_and_metrics_of_a_run_are_strict_json(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir(parents=True)
    run.write_summary({"final": {"c0": {"accuracy": math.nan, "loss": math.inf}}})
    run.write_metrics([{"round": 1, "client": "c0", "split": "test", "accuracy": math.nan}])
    assert _strict_loads(run.summary_path.read_text()) == {"final": {"c0": {"accuracy": None, "loss": None}}}
    assert _strict_loads(run.metrics_path.read_text().strip())["accuracy"] is None  # type: ignore[index]


def test_the_report_reads_null_as_missing(tmp_path: Path) -> None:
    from fedhet.report import load_run

    run = RunDirectory(tmp_path / "run")
    run.path.mkdir(parents=True)
    run.write_summary({"method": "fedavg", "dataset": "d", "seed": 0,
                       "final": {"c0": {"accuracy": math.nan}, "avg": {"accuracy": 0.5}}})
    record = load_run(run.path)
    assert math.isnan(record.final["c0"]["accuracy"]) and record.final["avg"]["accuracy"] == pytest.approx(0.5)
