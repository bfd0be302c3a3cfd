"""What a resume may change (rounds, keys named by --allow-config-change), what it refuses (naming every
differing key with both values), --overwrite, --resume without a checkpoint, the run-directory lock, and the
file modes of results."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedhet.config import load_config
from fedhet.engine.checkpoint import config_differences
from fedhet.engine.rundir import RunDirectory, RunDirError
from fedhet.engine.safe_load import load_trusted
from fedhet.errors import CheckpointError
from fedhet.launch.run import run_experiment

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "run.quiet=true", "data.max_test_per_client=40", "method=fedavg"]


def cfg(*extra: str):
    return load_config(None, BASE + list(extra))


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_trusted(run / "checkpoints" / "latest.pt", "checkpoint")["server"].model


def test_extending_a_finished_run_equals_a_longer_run(tmp_path: Path) -> None:
    run_experiment(cfg("rounds=4"), tmp_path / "long")
    run_experiment(cfg("rounds=2"), tmp_path / "short")
    assert (tmp_path / "short" / "summary.json").is_file()
    run_experiment(cfg("rounds=4"), tmp_path / "short", resume=True)
    for key, value in final_weights(tmp_path / "long").items():
        assert torch.equal(value, final_weights(tmp_path / "short")[key]), key
    summary = json.loads((tmp_path / "short" / "summary.json").read_text())
    assert summary["rounds_completed"] == 4
    assert summary["config_changes"] == [{"round": 2, "key": "rounds", "old": 2, "new": 4}]


def test_fewer_rounds_than_the_checkpoint_is_refused(tmp_path: Path) -> None:
    run_experiment(cfg("rounds=3"), tmp_path / "r")
    with pytest.raises(CheckpointError, match="beyond rounds=2"):
        run_experiment(cfg("rounds=2"), tmp_path / "r", resume=True)


def test_refusal_names_every_differing_key_with_both_values(tmp_path: Path) -> None:
    run_experiment(cfg("rounds=2"), tmp_path / "r", stop_after=1)
    with pytest.raises(CheckpointError) as err:
        run_experiment(cfg("rounds=2", "train.lr=0.5", "train.momentum=0.9"), tmp_path / "r", resume=True)
    text = str(err.value)
    assert "train.lr: 0.01 in the checkpoint, 0.5 now" in text and "train.momentum: 0.5" in text
    assert "--allow-config-change train.lr,train.momentum" in text and "method" not in text.split(":")[1]


def test_allow_config_change_continues_and_is_recorded(tmp_path: Path) -> None:
    run_experiment(cfg("rounds=3"), tmp_path / "r", stop_after=1)
    run_experiment(cfg("rounds=3", "train.lr=0.02"), tmp_path / "r", resume=True, allow_changes=("train.lr",))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["config_changes"] == [{"round": 1, "key": "train.lr", "old": 0.01, "new": 0.02}]
    with pytest.raises(CheckpointError, match="not a results-relevant config key"):
        run_experiment(cfg("rounds=3"), tmp_path / "r", resume=True, allow_changes=("train.lrr",))


def test_runtime_change_is_refused_and_named(tmp_path: Path) -> None:
    run_experiment(cfg("rounds=2"), tmp_path / "r", stop_after=1)
    with pytest.raises(CheckpointError, match="run.runtime: 'sequential' in the checkpoint, 'batched' now"):
        run_experiment(cfg("rounds=2", "run.runtime=batched"), tmp_path / "r", resume=True)


def test_operational_keys_may_change() -> None:
    a, b = cfg("rounds=2").to_dict(), cfg("rounds=9", "name=other", "run.checkpoint_every=7",
                                          "server.reply_timeout=5", "run.out_dir=elsewhere").to_dict()
    assert config_differences(a, b) == {}
    assert config_differences({**a, "run": {**a["run"], "device": "cpu"}}, cfg("run.device=cuda").to_dict()) == {
        "run.device": ("cpu", "cuda")}
    assert config_differences(a, cfg("run.num_threads=1").to_dict()) == {"run.num_threads": (None, 1)}


def test_overwrite_starts_again_and_resume_needs_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="no checkpoint"):
        run_experiment(cfg("rounds=2"), tmp_path / "r", resume=True)
    assert not (tmp_path / "r" / "checkpoints").exists()
    run_experiment(cfg("rounds=2"), tmp_path / "r", stop_after=1)
    with pytest.raises(RunDirError, match="--overwrite"):
        run_experiment(cfg("rounds=2", "train.lr=0.02"), tmp_path / "r")
    run_experiment(cfg("rounds=2", "train.lr=0.02"), tmp_path / "r", overwrite=True)
    run_experiment(cfg("rounds=2", "train.lr=0.02"), tmp_path / "fresh")
    for key, value in final_weights(tmp_path / "fresh").items():
        assert torch.equal(value, final_weights(tmp_path / "r")[key]), key


def test_a_second_writer_is_refused_and_a_dead_holder_does_not_block(tmp_path: Path) -> None:
    held = RunDirectory(tmp_path / "r")
    with held.locked():
        with pytest.raises(RunDirError, match=f"in use by another fedhet process \\(pid {os.getpid()}\\)"):
            run_experiment(cfg("rounds=1"), tmp_path / "r")
    # a process that took the lock and was killed: its lock file stays, the lock does not
    code = ("import os, sys; from fedhet.engine.rundir import RunDirectory\n"
            f"with RunDirectory({str(tmp_path / 'r')!r}).locked(): os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code], check=False)
    assert (tmp_path / "r" / ".lock").is_file()
    run_experiment(cfg("rounds=1"), tmp_path / "r")


def test_results_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        run_experiment(cfg("rounds=1"), tmp_path / "r")
    finally:
        os.umask(old)
    for name in ("metrics.jsonl", "summary.json", "config.yaml", "checkpoints/latest.pt"):
        assert stat.S_IMODE((tmp_path / "r" / name).stat().st_mode) == 0o644, name


def test_sweep_extends_finished_runs_when_rounds_grow(tmp_path: Path) -> None:
    from fedhet.launch.sweep import plan_sweep, run_status, run_sweep

    base = cfg("rounds=2", f"run.out_dir={tmp_path}")
    run_dir = run_sweep(plan_sweep(base, ["fedavg"], [0]), progress=False)[0]
    assert run_status(run_dir, 2) == "finished" and run_status(run_dir, 3) == "resume"
    run_sweep(plan_sweep(cfg("rounds=3", f"run.out_dir={tmp_path}"), ["fedavg"], [0]), progress=False)
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 3


def test_a_run_that_fails_before_writing_leaves_no_folder(tmp_path: Path) -> None:
    bad = cfg("rounds=1", "data.dataset=pacs", "data.root=" + str(tmp_path / "no-data"))
    with pytest.raises(Exception, match="pacs"):
        run_experiment(bad, tmp_path / "runs" / "a" / "b")
    assert not (tmp_path / "runs").exists()


def test_a_key_added_to_fedhet_after_the_checkpoint_reads_as_its_default() -> None:
    new = load_config(None, ["data.dataset=offline_digits"]).to_dict()
    old = json.loads(json.dumps(new))
    del old["train"]["grad_clip"], old["server"]["momentum"]  # as written before those keys existed
    assert config_differences(old, new) == {}
    changed = load_config(None, ["data.dataset=offline_digits", "server.momentum=0.9"]).to_dict()
    assert config_differences(old, changed) == {"server.momentum": (0.0, 0.9)}
