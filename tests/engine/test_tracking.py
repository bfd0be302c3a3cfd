"""run.loggers: every round's training loss, test metrics, wall time and traffic reach the trackers, per client
and as the client average; a resumed run shows no round twice."""

from __future__ import annotations

import csv
import sys
import types
from pathlib import Path

import pytest

from fedhet.config import load_config
from fedhet.errors import ConfigError
from fedhet.launch.run import run_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "run.quiet=true", "data.max_test_per_client=20", "rounds=3", "eval.every=1",
        "run.checkpoint_every=1", "run.num_threads=1"]


def _rows(run: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run / "tracking.csv").open()))


def test_csv_has_every_round_per_client_and_average(tmp_path: Path) -> None:
    run_experiment(load_config(None, [*BASE, "run.loggers=[csv]"]), tmp_path / "run")
    rows = _rows(tmp_path / "run")
    names = {r["name"] for r in rows}
    for name in ("train/loss/avg", "train/loss/clean", "test/accuracy/avg", "test/accuracy/clean",
                 "test/balanced_accuracy/avg", "round/time_s", "traffic/up_bytes", "traffic/down_params"):
        assert name in names, name
    assert sorted({int(r["round"]) for r in rows}) == [1, 2, 3]
    per_round = [r for r in rows if r["name"] == "train/loss/avg"]
    losses = {r["name"]: float(r["value"]) for r in rows if r["round"] == "1" and r["name"].startswith("train/loss/")}
    others = [v for k, v in losses.items() if k != "train/loss/avg"]
    assert len(per_round) == 3 and losses["train/loss/avg"] == pytest.approx(sum(others) / len(others))


def test_a_resumed_run_has_each_round_once(tmp_path: Path) -> None:
    cfg = load_config(None, [*BASE, "run.loggers=[csv]"])
    run_experiment(cfg, tmp_path / "run", stop_after=2)
    rows = _rows(tmp_path / "run")
    (tmp_path / "run" / "tracking.csv").write_text(  # as if round 3 had been logged before a kill
        "round,name,value\n" + "".join(f"{r['round']},{r['name']},{r['value']}\n" for r in rows) + "3,x,1.0\n")
    run_experiment(cfg, tmp_path / "run", resume=True)
    counts = [(r["round"], r["name"]) for r in _rows(tmp_path / "run")]
    assert len(counts) == len(set(counts)) and ("3", "x") not in counts


def test_tensorboard_writes_events(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_experiment(load_config(None, [*BASE, "run.loggers=[tensorboard]"]), tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("test/accuracy/avg")] == [1, 2, 3]
    assert "train/loss/avg" in events.Tags()["scalars"]


def test_mlflow_gets_each_round_with_its_step(tmp_path: Path, monkeypatch) -> None:
    logged: list[tuple[dict[str, float], int]] = []
    fake = types.SimpleNamespace(set_experiment=lambda name: None, start_run=lambda run_name: None,
                                 log_metrics=lambda values, step: logged.append((values, step)),
                                 end_run=lambda: logged.append(({"ended": 1.0}, -1)))
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object())
    run_experiment(load_config(None, [*BASE, "run.loggers=[mlflow]"]), tmp_path / "run")
    assert [step for _, step in logged] == [1, 2, 3, -1] and "test.accuracy.avg" in logged[0][0]


def test_bad_loggers_are_one_clear_error(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="unknown logger 'tensorbord'.*did you mean 'tensorboard'"):
        load_config(None, ["run.loggers=[tensorbord]"])
    from fedhet.engine.tracking import check_loggers

    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match="'wandb' needs the wandb package: pip install wandb"):
        check_loggers(["wandb"])
