"""A run directory: resolved config, per-round per-client metrics, summary, checkpoints, and its lock.

Every file is written atomically. One process at a time writes a run directory: `locked()` takes an exclusive
`flock` on `<run>/.lock` (the kernel drops it when the process dies, so a killed run never blocks a resume).
Failures to write (permissions, a file where a folder should be, a name too long) become one `RunDirError`
naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

import yaml

from fedhet.atomic import atomic_write_text, strict_json
from fedhet.errors import CheckpointError, FedhetError
from fedhet.yaml_input import JSONDict

METRIC_KEYS = ("accuracy", "balanced_accuracy", "loss")
# the round's fit + aggregate wall time (no evaluation), on each evaluated round's "avg" test row: a measurement,
# so the one field of metrics.jsonl that differs between two runs of the same config
TRAIN_TIME = "train_time_s"
LOCK_FILE = ".lock"
LATEST = "latest.pt"  # a run's checkpoint, in <run>/checkpoints
NAME_MAX = 255  # bytes per path component on Linux, macOS and Windows file systems
T = TypeVar("T")

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected against a second writer there
    fcntl = None  # type: ignore[assignment]


class RunDirError(FedhetError):
    """A run directory cannot be used: not writable, in use, or not a folder."""


def check_writable_path(path: Path) -> None:
    """Raise a RunDirError before any work if `path` cannot become a folder we write to."""
    for part in path.parts:
        if len(part.encode()) > NAME_MAX:
            raise RunDirError(f"the run directory name '{part[:40]}...' is {len(part.encode())} bytes, more than the "
                              f"file system's {NAME_MAX}: shorten name / label (or pass a shorter --run-dir)")
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"'{parent}' is a file, not a folder, so the run directory '{path}' cannot be "
                                  "created there: point run.out_dir (or --run-dir) at a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise RunDirError(f"cannot write in '{parent}' (permission denied): choose a writable "
                                  "run.out_dir (or --run-dir)")
            return


def _guard(path: Path, write: Callable[[], T]) -> T:
    try:
        return write()
    except OSError as err:
        if isinstance(err, FedhetError):
            raise
        reason = "name too long" if err.errno == errno.ENAMETOOLONG else (err.strerror or str(err))
        raise RunDirError(f"cannot write '{path}' ({reason}): free space or permissions there, or choose another "
                          "run.out_dir (or --run-dir); the last checkpoint is kept") from err


class RunDirectory:
    """Paths and writers for one run; every file is written atomically."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def latest_checkpoint(self) -> Path:
        return self.checkpoints / LATEST

    def is_finished(self) -> bool:
        return self.summary_path.is_file()

    def write_config(self, config: JSONDict) -> None:
        _guard(self.config_path, lambda: atomic_write_text(self.config_path, yaml.safe_dump(config, sort_keys=False)))

    def write_metrics(self, rows: list[JSONDict]) -> None:
        """Replace metrics.jsonl with `rows` (the checkpoint holds the same rows, so this file can always be
        rebuilt from it)."""
        text = "".join(strict_json(r) + "\n" for r in rows)
        _guard(self.metrics_path, lambda: atomic_write_text(self.metrics_path, text))

    def write_summary(self, summary: JSONDict) -> None:
        _guard(self.summary_path, lambda: atomic_write_text(self.summary_path, strict_json(summary, indent=2)))

    def clear(self) -> None:
        """Remove what fedhet wrote here (for --overwrite); other files are left alone."""
        for path in (self.config_path, self.metrics_path, self.summary_path):
            _guard(path, lambda p=path: p.unlink(missing_ok=True))  # type: ignore[misc]
        _guard(self.checkpoints, lambda: shutil.rmtree(self.checkpoints, ignore_errors=False)
               if self.checkpoints.is_dir() else None)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on the run directory, or raise RunDirError if another process holds it. Only
        the holder may remove the lock file (a run that failed before writing anything leaves no folders), and it
        does so while still holding it, so two starters can never both get in."""
        check_writable_path(self.path)
        created = [p for p in (self.path, *self.path.parents) if not p.exists()]
        _guard(self.path, lambda: self.path.mkdir(parents=True, exist_ok=True))
        lock_path = self.path / LOCK_FILE
        fh = self._acquire(lock_path)
        ok = False
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
            yield
            ok = True
        finally:
            if not ok and created and [p.name for p in self.path.iterdir()] == [LOCK_FILE]:
                _remove_empty(self.path, lock_path, created)  # while the lock is held
            fh.close()  # closing releases the lock

    def _acquire(self, lock_path: Path) -> IO[str]:
        """The open, flock-ed lock file. A file unlinked between our open and our lock (its holder removed it)
        is not the lock any more: lock the one now at `lock_path` instead."""
        for _ in range(5):
            fh = _guard(lock_path, lambda: open(lock_path, "a+"))
            if fcntl is None:
                return fh
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                owner = fh.read().strip() or "unknown"
                fh.close()
                raise RunDirError(f"run directory '{self.path}' is in use by another fedhet process (pid {owner}); "
                                  "wait for it to finish, or choose another run.out_dir / name") from None
            try:
                same = os.fstat(fh.fileno()).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fh
            fh.close()
        raise RunDirError(f"run directory '{self.path}' is being started and removed by other fedhet processes; "
                          "try again")


def _remove_empty(path: Path, lock_path: Path, created: list[Path]) -> None:
    """A run that failed before writing anything leaves no folders behind (only those this run created); the
    caller holds the lock."""
    with contextlib.suppress(OSError):
        lock_path.unlink()
        for folder in created:  # innermost first
            folder.rmdir()


class MissingCheckpointError(RunDirError, CheckpointError):
    """--resume where the run directory holds no checkpoint of the kind the job continues from."""


def start_check(run_dir: Path, resume: bool, overwrite: bool = False, checkpoint: str = LATEST) -> None:
    """Refuse to start a fresh job over a checkpoint (its own kind, `checkpoints/<checkpoint>`, or a plain
    run's), or to resume where there is none of its kind."""
    folder = RunDirectory(run_dir).checkpoints
    kind = "" if checkpoint == LATEST else f"{Path(checkpoint).stem} "
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the run, or start it again")
    if resume and not (folder / checkpoint).is_file():
        raise MissingCheckpointError(f"--resume: there is no {kind}checkpoint in '{run_dir}' to continue; run "
                                     "without --resume to start it (check name / run.out_dir / --run-dir if you "
                                     "expected one)")
    if not resume and not overwrite and any((folder / name).is_file() for name in {checkpoint, LATEST}):
        raise RunDirError(f"'{run_dir}' already holds a checkpoint: pass --resume to continue it, --overwrite to "
                          "start it again, or choose another run.out_dir / name")


@contextlib.contextmanager
def claimed(run_dir: Path, resume: bool, overwrite: bool, checkpoint: str = LATEST,
            extra: tuple[str, ...] = ()) -> Iterator[RunDirectory]:
    """The run directory of one job (a run, a tuning job), checked, locked for the job's whole life and, with
    `overwrite`, cleared of what fedhet wrote there (and of the job's `extra` folders); `start_check` runs
    before the lock (an error before any work) and again under it (no other process can write there then)."""
    check_writable_path(run_dir)
    start_check(run_dir, resume, overwrite, checkpoint)
    rundir = RunDirectory(run_dir)
    with rundir.locked():
        start_check(run_dir, resume, overwrite, checkpoint)
        if overwrite:
            rundir.clear()
            for folder in extra:
                shutil.rmtree(run_dir / folder, ignore_errors=True)
        yield rundir


def mean_train_time(rows: list[JSONDict]) -> float | None:
    """The mean of `TRAIN_TIME` over the rows that hold it (the evaluated rounds' "avg" test rows); None if none."""
    times = [float(r[TRAIN_TIME]) for r in rows if isinstance(r.get(TRAIN_TIME), (int, float))]
    return sum(times) / len(times) if times else None


def nan_mean(values: list[float]) -> float:
    """The mean of the values that are not NaN (a client without that split); NaN if there are none."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def last_avg_test_row(rows: list[JSONDict]) -> JSONDict | None:
    """The "avg" test row of the last round evaluated in `rows` (None: no round was)."""
    return next((r for r in reversed(rows) if r["client"] == "avg" and r["split"] == "test"), None)


def client_rows(rnd: int, split: str, per_client: dict[str, dict[str, float]]) -> list[JSONDict]:
    """Metric rows for one round and split, plus the uniform client average ('avg') as in the papers."""
    rows = [{"round": rnd, "client": name, "split": split, **m} for name, m in per_client.items()]
    if per_client:
        avg: JSONDict = {"round": rnd, "client": "avg", "split": split}
        for key in METRIC_KEYS:
            avg[key] = nan_mean([m[key] for m in per_client.values()])
        avg["num_examples"] = sum(int(m.get("num_examples", 0)) for m in per_client.values())
        rows.append(avg)
    return rows
