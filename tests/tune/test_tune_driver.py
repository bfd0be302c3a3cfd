"""`fedhet tune` plays its rounds on the engine's round driver (engine/driver.py): a Ctrl-C / SIGTERM at any
phase boundary of a tuning round stops the job at its last complete commit (one held back while a round is
committed lets that commit finish first), and --resume then gives the uninterrupted job's results bit for bit."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from tune_testing import BASE

from fedhet.config import load_config
from fedhet.engine.driver import RoundDriver
from fedhet.engine.loop import Interrupted
from fedhet.engine.rundir import MissingCheckpointError
from fedhet.tune.checkpoint import FILENAME, load_population
from fedhet.tune.run import TuneResult, TuningJob, run_tuning

PHASES = ("start", "committed", "checkpoint_saved", "metrics_written", "end")


def tuned(run_dir: Path, **kwargs) -> TuneResult:  # type: ignore[no-untyped-def]
    return run_tuning(load_config(None, BASE), run_dir, progress=False, **kwargs)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> TuneResult:
    return tuned(tmp_path_factory.mktemp("whole") / "run")


def signal_at(phase: str, rnd: int, signum: int):  # type: ignore[no-untyped-def]
    def hook(name: str, at: int) -> None:
        if name == phase and at == rnd:
            os.kill(os.getpid(), signum)
    return hook


@pytest.mark.parametrize(("phase", "rnd", "signum"), [("start", 1, signal.SIGTERM), ("committed", 3, signal.SIGINT),
                                                      ("metrics_written", 3, signal.SIGTERM)])
def test_a_signal_in_a_tuning_round_stops_at_the_last_commit_and_resumes_bit_exact(
        tmp_path: Path, whole: TuneResult, phase: str, rnd: int, signum: int) -> None:
    assert issubclass(TuningJob, RoundDriver)
    run = tmp_path / "run"
    with pytest.raises(Interrupted) as err:
        tuned(run, on_phase=signal_at(phase, rnd, signum))
    completed = rnd if PHASES.index(phase) >= PHASES.index("committed") else rnd - 1  # a begun commit completes
    cfg = load_config(None, BASE)
    saved = load_population(run / "checkpoints" / FILENAME, cfg)
    assert saved.round == completed and f"after round {completed}" in str(err.value)
    assert not (run / "summary.json").exists()
    resumed = tuned(run, resume=True)
    assert resumed.summary["final"] == whole.summary["final"] and resumed.summary["tune"] == whole.summary["tune"]
    for name in ("metrics.jsonl", "tune/members.jsonl", "tune/best_config.yaml"):
        assert (run / name).read_text() == (whole.run_dir / name).read_text()
    ours, theirs = (load_population(d / "checkpoints" / FILENAME, cfg).members for d in (run, whole.run_dir))
    assert all(torch.equal(a.server.model[k], b.server.model[k]) for a, b in zip(ours, theirs, strict=True)
               for k in a.server.model)


def test_the_run_directory_guard_is_the_engines(tmp_path: Path) -> None:
    """The one guard (engine/rundir.claimed): a resume needs this job's own kind of checkpoint, and a plain
    run's checkpoint blocks a fresh tuning job as a population checkpoint does."""
    with pytest.raises(MissingCheckpointError, match="no population checkpoint in"):
        tuned(tmp_path / "a", resume=True)
    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    (tmp_path / "b" / "checkpoints" / "latest.pt").write_bytes(b"")
    with pytest.raises(Exception, match="already holds a checkpoint: pass --resume"):
        tuned(tmp_path / "b")
