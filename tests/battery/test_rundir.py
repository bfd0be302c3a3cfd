"""Bad run directories: a file in the way, names that escape or overflow, no permission, a second writer,
--resume / --overwrite misuse. Each gets one clear error and leaves what was written before untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def test_out_dir_is_a_file(battery) -> None:
    blocker = battery.write("blocker", "not a folder")
    battery.fails(["run", *battery.tiny_with(f"run.out_dir={blocker}")], "is a file", "run.out_dir")


def test_run_dir_is_a_file(battery) -> None:
    blocker = battery.write("results.txt", "not a folder")
    battery.fails(["run", *battery.tiny, "--run-dir", str(blocker)], "is a file", "--run-dir")


def test_run_dir_below_a_file(battery) -> None:
    blocker = battery.write("blocker", "x")
    battery.fails(["run", *battery.tiny, "--run-dir", str(blocker / "deeper" / "run")], "is a file")


def test_name_too_long_for_the_file_system(battery) -> None:
    battery.watch(battery.root)
    battery.fails(["run", *battery.tiny_with("name=" + "n" * 300)], "bytes", "shorten name")


@pytest.mark.parametrize("name", ["../../escape", "a/../../escape", "/tmp/absolute"])
def test_name_may_not_leave_out_dir(battery, name: str) -> None:
    battery.watch(battery.root)
    battery.fails(["run", *battery.tiny_with(f"name={name}")], "inside run.out_dir", "--run-dir")


def test_sweep_out_dir_is_a_file(battery) -> None:
    blocker = battery.write("blocker", "x")
    cfg = battery.tiny_config(extra="sweep: {methods: [fedavg], seeds: [0]}\n")
    battery.fails(["sweep", str(cfg), f"run.out_dir={blocker}", "-q"], "is a file")


def test_resume_without_a_checkpoint(battery) -> None:
    battery.watch(battery.root)
    battery.fails(["run", *battery.tiny, "--run-dir", str(battery.root / "fresh"), "--resume"],
                  "no checkpoint", "without --resume")
    assert not (battery.root / "fresh" / "checkpoints").exists()


def test_fresh_run_over_a_checkpoint(battery) -> None:
    run = battery.finished_run()
    battery.fails(["run", *battery.tiny_with("rounds=2"), "--run-dir", str(run)], "already holds a checkpoint",
                  "--resume", "--overwrite")


def test_resume_and_overwrite_together(battery) -> None:
    run = battery.finished_run()
    battery.fails(["run", *battery.tiny_with("rounds=2"), "--run-dir", str(run), "--resume", "--overwrite"],
                  "exclude each other")


def test_allow_config_change_without_resume(battery) -> None:
    run = battery.finished_run()
    battery.fails(["run", *battery.tiny_with("rounds=2"), "--run-dir", str(run), "--allow-config-change", "train.lr"],
                  "add --resume")


def test_a_second_writer_is_refused(battery) -> None:
    run = battery.finished_run()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from fedhet.engine.rundir import RunDirectory\n"
        f"with RunDirectory({str(run)!r}).locked():\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        battery.watch(run)  # the holder wrote its pid into .lock
        battery.fails(["run", *battery.tiny_with("rounds=3"), "--run-dir", str(run), "--resume"],
                      "in use by another fedhet process", f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()


def _make_read_only(folder: Path) -> Callable[[], None]:
    """Make `folder` unwritable even for root (immutable via chattr, since permission bits do not bind root);
    returns the undo. Skips the test where neither works."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        return lambda: os.chmod(folder, 0o755)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], check=False,
                                                          capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i: cannot make a folder read-only")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("where", ["out_dir", "run_dir"])
def test_read_only_parent(battery, where: str) -> None:
    locked = battery.root / "locked"
    locked.mkdir()
    battery.watch(locked)
    undo = _make_read_only(locked)
    try:
        flags = ([*battery.tiny_with(f"run.out_dir={locked}")] if where == "out_dir"
                 else [*battery.tiny, "--run-dir", str(locked / "run")])
        battery.fails(["run", *flags], "permission denied", "run.out_dir")
    finally:
        undo()
