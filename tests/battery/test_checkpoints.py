"""Bad checkpoints and refused resumes: corrupt, truncated, foreign or old files, and configs that differ from
the checkpoint's. Each error names what differs (with both values) and the ways on; the run is untouched."""

from __future__ import annotations

import pytest
import torch

CHANGES = {  # override: words of the error
    "train.lr=0.5": ("train.lr: 0.01 in the checkpoint, 0.5 now", "--allow-config-change train.lr"),
    "method=fedbn": ("method: 'fedavg' in the checkpoint, 'fedbn' now",),
    "seed=3": ("seed: 0 in the checkpoint, 3 now",),
    "run.runtime=batched": ("run.runtime: 'sequential'", "float tolerance"),
    "run.num_threads=2": ("run.num_threads: 1 in the checkpoint, 2 now",),
    "data.max_test_per_client=30": ("data.max_test_per_client: 20", "--overwrite"),
    "model.args={width: 16}": ("model.args.width: 8 in the checkpoint, 16 now",),
}


@pytest.mark.parametrize("override", list(CHANGES))
def test_resume_with_a_different_config_names_the_key(battery, override: str) -> None:
    run = battery.finished_run()
    battery.fails(["run", *battery.tiny_with("rounds=3", override), "--run-dir", str(run), "--resume"],
                  "different config", *CHANGES[override])


def test_two_differences_are_both_named(battery) -> None:
    run = battery.finished_run()
    line = battery.fails(["run", *battery.tiny_with("rounds=3", "train.lr=0.5", "train.batch_size=8"), "--run-dir",
                          str(run), "--resume"], "train.lr", "train.batch_size")
    assert "--allow-config-change train.batch_size,train.lr" in line


def test_fewer_rounds_than_done(battery) -> None:
    run = battery.finished_run()
    battery.fails(["run", *battery.tiny_with("rounds=1"), "--run-dir", str(run), "--resume"], "at round 2",
                  "rounds >= 2")


def test_allowing_an_unknown_key(battery) -> None:
    run = battery.finished_run()
    battery.fails(["run", *battery.tiny_with("rounds=3"), "--run-dir", str(run), "--resume", "--allow-config-change",
                   "train.lrr"], "train.lrr", "not a results-relevant config key")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_unreadable_checkpoint(battery, damage: str) -> None:
    run = battery.finished_run()
    ckpt = run / "checkpoints" / "latest.pt"
    data = ckpt.read_bytes()
    ckpt.write_bytes({"garbage": b"not a checkpoint", "truncated": data[: len(data) // 2], "empty": b""}[damage])
    battery.watch(run)
    battery.fails(["run", *battery.tiny_with("rounds=3"), "--run-dir", str(run), "--resume"], "corrupt or unreadable",
                  "--overwrite")


@pytest.mark.parametrize("payload", [[1, 2, 3], {"format": 1, "fingerprint": "abc", "round": 2}])
def test_foreign_or_old_checkpoint(battery, payload: object) -> None:
    run = battery.finished_run()
    torch.save(payload, run / "checkpoints" / "latest.pt")
    battery.watch(run)
    battery.fails(["run", *battery.tiny_with("rounds=3"), "--run-dir", str(run), "--resume"], "not a fedhet checkpoint",
                  "--overwrite")


def test_allowed_change_resumes_and_is_recorded(battery) -> None:
    import json

    run = battery.finished_run()
    battery.succeeds(["run", *battery.tiny_with("rounds=3", "train.lr=0.02"), "--run-dir", str(run), "--resume",
                      "--allow-config-change", "train.lr"])
    changes = json.loads((run / "summary.json").read_text())["config_changes"]
    assert {"round": 2, "key": "train.lr", "old": 0.01, "new": 0.02} in changes
    assert {"round": 2, "key": "rounds", "old": 2, "new": 3} in changes
