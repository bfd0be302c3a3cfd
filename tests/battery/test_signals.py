"""Signals and divergence during a run, in real processes: Ctrl-C / SIGTERM at a phase of a round (sent by the
process to itself from `RoundLoop`'s phase hook, so the point is exact), and a NaN loss. Each ends with one
line that says where the run stopped and how to go on, and the way on works."""

from __future__ import annotations

import json

import pytest

from battery.harness import assert_one_clear_error, run_cli_subprocess
from fedhet.engine.safe_load import load_trusted

HOOK = """import os, signal
from fedhet.engine import loop
_original = loop.RoundLoop._phase
def _phase(self, name, rnd):
    if (name, rnd) == ({phase!r}, 2):
        os.kill(os.getpid(), signal.{signal})
    _original(self, name, rnd)
loop.RoundLoop._phase = _phase
"""


@pytest.mark.parametrize(("phase", "sig", "done"), [
    ("start", "SIGINT", 1), ("trained", "SIGTERM", 1), ("evaluated", "SIGINT", 1), ("committed", "SIGTERM", 2),
    ("checkpoint_saved", "SIGINT", 2), ("end", "SIGTERM", 2)])
def test_signal_in_a_round_then_resume(battery, phase: str, sig: str, done: int) -> None:
    run = battery.root / "run"
    argv = ["run", *battery.tiny_with("rounds=3", "run.checkpoint_every=1"), "--run-dir", str(run), "-q"]
    result = run_cli_subprocess(argv, prelude=HOOK.format(phase=phase, signal=sig), cwd=battery.root)
    line = assert_one_clear_error(result, f"interrupted after round {done}", "--resume", code=130)
    assert load_trusted(run / "checkpoints" / "latest.pt", "checkpoint")["round"] == done
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["round"] for r in rows} == set(range(1, done + 1)), line
    battery.succeeds([*argv, "--resume"])
    assert json.loads((run / "summary.json").read_text())["rounds_completed"] == 3


def test_nan_loss_says_how_to_go_on_and_that_way_works(battery) -> None:
    run = battery.root / "run"
    def argv(*overrides: str) -> list[str]:
        return ["run", *battery.tiny_with(*overrides), "--run-dir", str(run), "-q"]

    battery.succeeds(argv("rounds=1"))
    battery.watch(run)
    line = battery.fails([*argv("rounds=3", "train.lr=.inf"), "--resume", "--allow-config-change", "train.lr"],
                         "NaN/inf", "--allow-config-change", "--overwrite")
    assert "round 2" in line
    battery.succeeds([*argv("rounds=3", "train.lr=0.02"), "--resume", "--allow-config-change", "train.lr"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds_completed"] == 3
    assert {"round": 1, "key": "train.lr", "old": 0.01, "new": 0.02} in summary["config_changes"]
