"""Checkpoint / resume: 10 rounds straight == 5 + resume 5, bit for bit; interrupts, corruption, NaN."""

from __future__ import annotations

import json

import pytest
import torch
from fedhet_testing import assert_same_run

from fedhet.config import load_config
from fedhet.engine.loop import Interrupted, RoundLoop
from fedhet.engine.safe_load import load_trusted
from fedhet.errors import CheckpointError, TrainingDivergedError
from fedhet.launch.run import run_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "run.quiet=true", "run.checkpoint_every=3", "data.max_test_per_client=40"]


def cfg(*extra: str):
    return load_config(None, BASE + list(extra))


def weights(run_dir) -> dict:
    return load_trusted(run_dir / "checkpoints" / "latest.pt", "checkpoint")


def test_resume_is_bit_exact(tmp_path) -> None:
    c = cfg("rounds=10", "method=fedbn")
    run_experiment(c, tmp_path / "straight")
    first = run_experiment(c, tmp_path / "split", stop_after=5)
    assert first.rounds_completed == 5 and not (tmp_path / "split" / "summary.json").exists()
    run_experiment(c, tmp_path / "split", resume=True)
    assert_same_run(tmp_path / "straight", tmp_path / "split")
    rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["round"] for r in rows}) == list(range(1, 11))


def test_interrupt_checkpoints_and_resumes(tmp_path, monkeypatch) -> None:
    c = cfg("rounds=4", "method=fedavg")
    run_experiment(c, tmp_path / "straight")
    from fedhet.engine import loop as loop_module

    original = loop_module.RoundLoop.train_round

    def interrupt_in_round_3(self: RoundLoop, rnd: int) -> None:
        if rnd == 3:
            raise KeyboardInterrupt
        original(self, rnd)

    monkeypatch.setattr(loop_module.RoundLoop, "train_round", interrupt_in_round_3)
    with pytest.raises(Interrupted, match="after round 2"):
        run_experiment(c, tmp_path / "split")
    assert weights(tmp_path / "split")["round"] == 2
    monkeypatch.setattr(loop_module.RoundLoop, "train_round", original)
    run_experiment(c, tmp_path / "split", resume=True)
    assert_same_run(tmp_path / "straight", tmp_path / "split")


def test_existing_checkpoint_requires_resume(tmp_path) -> None:
    c = cfg("rounds=2")
    run_experiment(c, tmp_path / "r", stop_after=1)
    with pytest.raises(Exception, match="--resume"):
        run_experiment(c, tmp_path / "r")


def test_corrupt_checkpoint_is_reported_and_kept(tmp_path) -> None:
    c = cfg("rounds=2")
    run_experiment(c, tmp_path / "r", stop_after=1)
    ckpt = tmp_path / "r" / "checkpoints" / "latest.pt"
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        run_experiment(c, tmp_path / "r", resume=True)
    assert ckpt.read_bytes() == b"not a checkpoint"


def test_mismatched_checkpoint_is_rejected(tmp_path) -> None:
    run_experiment(cfg("rounds=2", "method=fedavg"), tmp_path / "r", stop_after=1)
    before = (tmp_path / "r" / "checkpoints" / "latest.pt").read_bytes()
    with pytest.raises(CheckpointError, match="different config"):
        run_experiment(cfg("rounds=2", "method=fedbn"), tmp_path / "r", resume=True)
    assert (tmp_path / "r" / "checkpoints" / "latest.pt").read_bytes() == before


def test_nan_loss_stops_with_checkpoint(tmp_path) -> None:
    c = cfg("rounds=5", "method=fedavg", "train.lr=1e12", "train.momentum=0.9", "train.local_steps=3")
    with pytest.raises(TrainingDivergedError, match="lower train.lr"):
        run_experiment(c, tmp_path / "r")
    payload = weights(tmp_path / "r")
    assert all(torch.isfinite(v).all() for v in payload["server"].model.values() if v.is_floating_point())


def test_interrupt_after_aggregation_rolls_back_the_partial_round(tmp_path, monkeypatch) -> None:
    c = cfg("rounds=4", "method=fedbn")
    run_experiment(c, tmp_path / "straight")
    from fedhet.engine import loop as loop_module

    original = loop_module.RoundLoop.evaluate_round

    def interrupt_while_evaluating_round_3(self: RoundLoop, rnd: int) -> float:
        acc = original(self, rnd)  # round 3 is trained, aggregated and its metric rows appended ...
        if rnd == 3:
            raise KeyboardInterrupt  # ... then the run is stopped before the round is committed
        return acc

    monkeypatch.setattr(loop_module.RoundLoop, "evaluate_round", interrupt_while_evaluating_round_3)
    with pytest.raises(Interrupted, match="after round 2"):
        run_experiment(c, tmp_path / "split")
    assert max(r["round"] for r in weights(tmp_path / "split")["metrics"]) == 2
    monkeypatch.setattr(loop_module.RoundLoop, "evaluate_round", original)
    run_experiment(c, tmp_path / "split", resume=True)
    assert_same_run(tmp_path / "straight", tmp_path / "split")
