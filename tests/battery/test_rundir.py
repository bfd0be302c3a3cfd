"""Bad run directories: a file in the way, names that escape or overflow, no permission, a second writer,
--resume / --overwrite misuse. Each gets one clear error and leaves what was written before untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from battery.harness import assert_one_clear_error, run_cli_subprocess


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


@pytest.mark.skipif(not hasattr(os, "setuid"), reason="POSIX only")
def test_read_only_parent(battery) -> None:
    """Permission bits do not bind root, so as root the command runs as `nobody` (uid 65534), in a folder
    outside pytest's private tmp tree."""
    base = Path(tempfile.mkdtemp(prefix="fedhet-ro-"))
    locked = base / "locked"
    locked.mkdir()
    os.chmod(base, 0o755)
    os.chmod(locked, 0o555)
    prelude = "import os\nif os.getuid() == 0:\n    os.setgid(65534); os.setuid(65534)\n"
    env = {"HOME": str(base), "MPLCONFIGDIR": str(base / "mpl")}
    try:
        result = run_cli_subprocess(["run", *battery.tiny, "--run-dir", str(locked / "run")], prelude=prelude,
                                    env=env, cwd=base)
        if "ModuleNotFoundError" in result.err or "site-packages" in result.err:
            pytest.skip("the project is not readable by nobody here")
        assert_one_clear_error(result, "permission denied", "run.out_dir")
        assert not (locked / "run").exists()
    finally:
        os.chmod(locked, 0o755)
        shutil.rmtree(base)
