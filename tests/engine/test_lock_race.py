"""Two or more fedhet processes starting on the same new run directory at the same instant: exactly one gets
the lock at a time, and a loser never removes the winner's lock file."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

from fedhet.engine.rundir import RunDirectory
from fedhet.errors import FedhetError


def _starter(path: str, barrier: object, inside: object, overlaps: object, fail_inside: bool) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        with RunDirectory(path).locked():
            with inside.get_lock():  # type: ignore[attr-defined]
                inside.value += 1  # type: ignore[attr-defined]
                if inside.value > 1:  # type: ignore[attr-defined]
                    overlaps.value += 1  # type: ignore[attr-defined]
            time.sleep(0.02)
            with inside.get_lock():  # type: ignore[attr-defined]
                inside.value -= 1  # type: ignore[attr-defined]
            if fail_inside:
                raise RuntimeError("the run failed before writing anything")
    except (FedhetError, RuntimeError):
        pass


def test_concurrent_starters_never_share_a_run_directory(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    overlaps = ctx.Value("i", 0)
    for trial in range(16):  # the old lock let two in about once in 10 trials of 6 starters
        path = tmp_path / f"t{trial}" / "runs" / "seed0"  # new: every starter may create it
        barrier, inside = ctx.Barrier(6), ctx.Value("i", 0)
        procs = [ctx.Process(target=_starter, args=(str(path), barrier, inside, overlaps, i % 2 == 0))
                 for i in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    assert overlaps.value == 0, f"{overlaps.value} times two processes held the lock together"


def test_a_loser_leaves_the_winners_lock(tmp_path: Path) -> None:
    path = tmp_path / "new" / "seed0"
    with RunDirectory(path).locked():
        lock = path / ".lock"
        inode = os.stat(lock).st_ino
        try:
            with RunDirectory(path).locked():
                raise AssertionError("a second holder got in")
        except FedhetError as err:
            assert "in use by another fedhet process" in str(err)
        assert os.stat(lock).st_ino == inode
