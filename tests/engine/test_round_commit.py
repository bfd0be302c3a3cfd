"""A round is committed to disk as a whole: a signal at any phase boundary, then --resume, gives the same run
as an uninterrupted one (weights bit for bit, metrics.jsonl byte for byte); a kill between the final checkpoint
and the metrics write loses nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from fedhet_testing import assert_same_run

from fedhet.config import load_config
from fedhet.engine.loop import Interrupted
from fedhet.engine.safe_load import load_trusted
from fedhet.launch.run import run_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "run.quiet=true", "data.max_test_per_client=40", "method=fedbn", "rounds=4",
        "run.checkpoint_every=2", "eval.every=1"]
PHASES = ("start", "trained", "evaluated", "committed", "checkpoint_saved", "metrics_written", "end")


def cfg(*extra: str):
    return load_config(None, BASE + list(extra))


def assert_same_finished_run(a: Path, b: Path) -> None:
    assert_same_run(a, b)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert sa["final"] == sb["final"] and sa["rounds_completed"] == sb["rounds_completed"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("straight") / "run"
    run_experiment(cfg(), path)
    return path


def signal_at(phase: str, rnd: int, signum: int):
    def hook(name: str, at: int) -> None:
        if name == phase and at == rnd:
            os.kill(os.getpid(), signum)
    return hook


# round 2 ends with a checkpoint (checkpoint_every=2), round 3 does not: both kinds of commit are covered
@pytest.mark.parametrize("rnd", [2, 3])
@pytest.mark.parametrize("phase", PHASES)
def test_signal_at_every_phase_then_resume_is_bit_exact(tmp_path: Path, straight: Path, phase: str,
                                                         rnd: int) -> None:
    if phase in ("checkpoint_saved", "metrics_written") and rnd == 3:
        pytest.skip("round 3 writes no checkpoint")
    signum = signal.SIGTERM if (PHASES.index(phase) + rnd) % 2 else signal.SIGINT
    with pytest.raises(Interrupted) as err:
        run_experiment(cfg(), tmp_path / "run", on_phase=signal_at(phase, rnd, signum))
    stopped = load_trusted(tmp_path / "run" / "checkpoints" / "latest.pt", "checkpoint")
    completed = rnd if PHASES.index(phase) >= PHASES.index("committed") else rnd - 1
    assert stopped["round"] == completed and f"after round {completed}" in str(err.value)
    assert {r["round"] for r in stopped["metrics"]} == set(range(1, completed + 1))
    assert not (tmp_path / "run" / "summary.json").exists()
    run_experiment(cfg(), tmp_path / "run", resume=True)
    assert_same_finished_run(straight, tmp_path / "run")


class HardKill(BaseException):
    """Stands in for kill -9: nothing of the loop's handlers runs."""


def test_kill_between_final_checkpoint_and_metrics_write_is_repaired(tmp_path: Path, straight: Path) -> None:
    def kill(name: str, at: int) -> None:
        if name == "checkpoint_saved" and at == 4:
            raise HardKill
    with pytest.raises(HardKill):
        run_experiment(cfg(), tmp_path / "run", on_phase=kill)
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert max(json.loads(r)["round"] for r in rows) == 3  # the last row is missing on disk
    run_experiment(cfg(), tmp_path / "run", resume=True)
    assert_same_finished_run(straight, tmp_path / "run")


def test_resume_rewrites_metrics_from_the_checkpoint(tmp_path: Path) -> None:
    run_experiment(cfg(), tmp_path / "run", stop_after=2)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"round": 1, "trunc')
    run_experiment(cfg(), tmp_path / "run", resume=True, stop_after=3)
    rounds = [json.loads(r)["round"] for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(rounds)) == [1, 2, 3]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_summary_is_written_completes_it_then_stops(tmp_path: Path, monkeypatch,
                                                                       signum: int) -> None:
    from fedhet.engine.rundir import RunDirectory

    write = RunDirectory.write_summary

    def interrupted_write(self: RunDirectory, summary: dict) -> None:
        os.kill(os.getpid(), signum)  # arrives while the summary is being written
        write(self, summary)

    monkeypatch.setattr(RunDirectory, "write_summary", interrupted_write)
    with pytest.raises(Interrupted, match="interrupted as the run finished; its results are complete"):
        run_experiment(cfg(), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 4 and "traffic_per_client_round" in summary


def test_a_run_resumed_before_its_summary_keeps_its_traffic(tmp_path: Path, straight: Path) -> None:
    run = tmp_path / "run"
    run_experiment(cfg(), run)
    (run / "summary.json").unlink()  # killed after the final checkpoint, before the summary
    run_experiment(cfg(), run, resume=True)
    before = json.loads((straight / "summary.json").read_text())["traffic_per_client_round"]
    assert json.loads((run / "summary.json").read_text())["traffic_per_client_round"] == before


def test_a_round_returns_its_accuracy_only_when_evaluated(tmp_path: Path) -> None:
    """`play` returns the round's average test accuracy (not its validation one) when the round is evaluated
    (every eval.every rounds, and the last), else None; the progress bar shows the last evaluated round's."""
    from fedhet.engine.experiment import build_experiment
    from fedhet.engine.loop import RoundLoop
    from fedhet.launch.run import make_executor

    exp = build_experiment(cfg("rounds=3", "eval.every=2", "method=fedavg", "eval.val=true", "data.val_fraction=0.2"))
    loop = RoundLoop(exp, tmp_path / "run", make_executor(exp), progress=False)
    assert loop.status() is None
    accuracies = [loop.play(rnd) for rnd in (1, 2, 3)]
    avg = {r["round"]: r["accuracy"] for r in loop.metrics if r["client"] == "avg" and r["split"] == "test"}
    assert accuracies == [None, avg[2], avg[3]]
    assert loop.status() == f"acc={avg[3]:.3f}"
