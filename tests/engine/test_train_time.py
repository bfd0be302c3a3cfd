"""metrics.jsonl holds each evaluated round's training time (`train_time_s`: fit + aggregate, no evaluation) on its
avg test row, and summary.json its mean."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import fedhet.engine.loop as loop
from fedhet.config import load_config
from fedhet.launch.run import run_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "run.quiet=true", "data.max_test_per_client=20", "rounds=3", "eval.every=2"]
FIT_SLEEP, EVAL_SLEEP = 0.2, 0.6


def test_train_time_counts_fit_and_aggregate_but_not_evaluation(tmp_path: Path, monkeypatch) -> None:
    fit_and_aggregate = loop.fit_and_aggregate

    def slow_fit(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - passes through the engine's arguments
        time.sleep(FIT_SLEEP)
        return fit_and_aggregate(*args, **kwargs)

    marks: dict[tuple[int, str], float] = {}

    def slow_evaluation(phase: str, rnd: int) -> None:  # between training and evaluation: not training time
        marks[rnd, phase] = time.perf_counter()
        if phase == "trained":
            time.sleep(EVAL_SLEEP)

    monkeypatch.setattr(loop, "fit_and_aggregate", slow_fit)
    result = run_experiment(load_config(None, BASE), tmp_path / "run", on_phase=slow_evaluation)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = {r["round"]: r["train_time_s"] for r in rows if "train_time_s" in r}
    assert [(r["client"], r["split"]) for r in rows if "train_time_s" in r] == [("avg", "test")] * 2
    assert sorted(timed) == [2, 3]  # the evaluated rounds (eval.every=2, and the last)
    for rnd, seconds in timed.items():  # within the span from the round's start to the end of its training
        assert FIT_SLEEP <= seconds <= marks[rnd, "trained"] - marks[rnd, "start"], (rnd, seconds, marks)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["train_time_s"] == pytest.approx(sum(timed.values()) / 2)
    assert summary["round_time_s"] > summary["train_time_s"] + EVAL_SLEEP
    assert result.summary["train_time_s"] == summary["train_time_s"]


def test_trackers_get_train_time_as_a_round_number_not_a_test_metric() -> None:
    from fedhet.engine.tracking import round_record

    rows = [{"round": 1, "client": "avg", "split": "test", "accuracy": 0.5, "num_examples": 4, "train_time_s": 0.25}]
    record = round_record(1, rows, {}, 1.0, {})
    assert record.scalars == {"round/time_s": 1.0, "round/train_time_s": 0.25}
    assert record.per_client == {"avg": {"test/accuracy": 0.5}}
