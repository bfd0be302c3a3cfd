"""The bad-input battery's harness: run the `fedhet` CLI, assert one clear error, and that nothing changed.

Use it through the `battery` fixture (tests/battery/conftest.py), one `Battery` per test:

    def test_empty_config(battery):
        cfg = battery.write("c.yaml", "")                      # a file under battery.root (str or bytes)
        battery.finished_run()                                 # a finished tiny run, watched from now on
        line = battery.fails(["run", str(cfg), *battery.tiny], "empty", "{}")

`fails(argv, *words)` runs `fedhet.cli.main(argv)` in-process and asserts: exit code != 0 (or `code=`), stderr is
exactly one non-empty line starting with "error:" and holding no "Traceback", every word of `words` occurs in
it (case-insensitive; give words that name the problem AND the fix), and every watched path (`watch(path)`,
the files `write` made, `finished_run()`) has the same digest as before: no file added, removed, changed or
re-moded. It returns the line. `succeeds(argv)` asserts exit code 0 and returns the `CliResult`.

Module-level helpers for tests that need more: `run_cli(argv)` (in-process, captures stdout / stderr and the
warnings the CLI logs), `run_cli_subprocess(argv, prelude=...)` (a real `python` process, e.g. for signals:
`prelude` is Python code run before `main`, such as a hook that sends the process a signal at a chosen point),
`assert_one_clear_error(result, *words)` and `tree_digest(path)`. The working directory is `battery.root`
during a test, so default output folders (`runs/`, `report/`) land there. `battery.tiny` is a list of
`key=value` overrides for a run of about 0.2 s (offline_digits, 1 round, 1 local step, a width-8 CNN, one
thread; no run.out_dir, so results land in `battery.root / "runs"`). A key given twice on the command line
is an error: change one of `tiny`'s keys with `battery.tiny_with("rounds=3", ...)`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

TINY = ("data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "rounds=1",
        "train.local_steps=1", "data.max_test_per_client=20", "run.num_threads=1")
TINY_YAML = """name: tiny
rounds: 1
data: {dataset: offline_digits, max_test_per_client: 20}
model: {name: small_cnn, args: {width: 8}}
train: {local_steps: 1}
run: {num_threads: 1, out_dir: runs}
"""


@dataclass
class CliResult:
    """Exit code and captured output of one `fedhet` command."""

    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_cli(argv: Sequence[str]) -> CliResult:
    """`fedhet.cli.main(argv)` in this process; stdout, stderr and WARNING+ log records (as the CLI prints them)
    are captured. A SystemExit (argparse's --help) becomes its code; a KeyboardInterrupt that escapes `main`
    becomes code -130 and a "Traceback" line (so pytest does not take it for the user's Ctrl-C)."""
    from fedhet.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except KeyboardInterrupt:  # escaped main(): a failure of the test, not the end of the pytest session
                code = -130
                print("Traceback (KeyboardInterrupt escaped fedhet.cli.main)", file=sys.stderr)
    finally:
        root.removeHandler(handler)
    return CliResult(int(code), out.getvalue(), err.getvalue())


def run_cli_subprocess(argv: Sequence[str], prelude: str = "", cwd: Path | None = None,
                       env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
    """`fedhet argv` in a fresh Python process (after running `prelude`), one torch thread."""
    code = f"{prelude}\nimport sys\nfrom fedhet.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_one_clear_error(result: CliResult, *words: str, code: int | None = None) -> str:
    """Exit code != 0 (or == `code`), stderr one line "error: ..." without a traceback, holding every word."""
    assert result.code != 0, f"exit code 0 for bad input; stdout: {result.out[-500:]!r}"
    if code is not None:
        assert result.code == code, f"exit code {result.code}, expected {code}; stderr: {result.err!r}"
    assert "Traceback" not in result.err, result.err
    lines = result.err_lines
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {result.err!r}"
    line = lines[0]
    assert line.startswith("error: "), line
    missing = [w for w in words if w.lower() not in line.lower()]
    assert not missing, f"the error does not say {missing}: {line}"
    return line


def tree_digest(path: Path) -> dict[str, tuple[str, int]]:
    """relative path -> (sha256 of the content, or 'dir'; permission bits) for `path` and everything under it."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return {}
    items = [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]
    digest = {}
    for item in items:
        rel = str(item.relative_to(path)) if item != path else "."
        mode = item.lstat().st_mode & 0o7777
        content = "dir" if item.is_dir() else hashlib.sha256(item.read_bytes()).hexdigest() if item.is_file() \
            else "other"
        digest[rel] = (content, mode)
    return digest


@dataclass
class Battery:
    """One test's sandbox: `root` (the working directory), watched paths, and the assertions."""

    root: Path
    template_run: Path | None = None
    watched: dict[Path, dict[str, tuple[str, int]]] = field(default_factory=dict)
    tiny: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tiny = list(TINY)  # results land in ./runs = root / "runs" (the working directory is root)

    def tiny_with(self, *overrides: str) -> list[str]:
        """`tiny` with `overrides` (key=value) replacing its entries of the same key: giving a key twice on the
        command line is an error, so `[*battery.tiny, "rounds=3"]` fails; `battery.tiny_with("rounds=3")` works."""
        keys = {o.split("=", 1)[0].strip() for o in overrides}
        return [o for o in self.tiny if o.split("=", 1)[0] not in keys] + list(overrides)

    def watch(self, *paths: Path) -> None:
        """Record the digest of `paths` now; `fails` asserts they are unchanged after the command."""
        for p in paths:
            self.watched[Path(p)] = tree_digest(Path(p))

    def write(self, name: str, content: str | bytes, watch: bool = True) -> Path:
        """A file under `root` (parents created), watched unless `watch=False`."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        if watch:
            self.watch(path)
        return path

    def tiny_config(self, name: str = "tiny.yaml", extra: str = "") -> Path:
        """A YAML config for a tiny run (see TINY_YAML), plus the lines of `extra`, watched."""
        return self.write(name, TINY_YAML + extra)

    def finished_run(self, dest: str = "prev/run") -> Path:
        """A copy of a finished tiny run of 2 rounds (config.yaml, metrics.jsonl, summary.json, checkpoints/),
        watched (after changing its files, `watch` it again)."""
        assert self.template_run is not None, "the battery fixture provides the template run"
        path = self.root / dest
        shutil.copytree(self.template_run, path)
        self.watch(path)
        return path

    def check_unchanged(self) -> None:
        for path, before in self.watched.items():
            after = tree_digest(path)
            assert after == before, f"{path} changed: {_diff(before, after)}"

    def fails(self, argv: Sequence[str], *words: str, code: int | None = None) -> str:
        """Run `argv`; assert one clear error holding `words` and that no watched path changed; return it."""
        line = assert_one_clear_error(run_cli(argv), *words, code=code)
        self.check_unchanged()
        return line

    def succeeds(self, argv: Sequence[str]) -> CliResult:
        result = run_cli(argv)
        assert result.code == 0, f"exit code {result.code}: {result.err[-2000:]}"
        return result


def _diff(before: dict, after: dict) -> str:
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    return (f"added {sorted(after.keys() - before.keys())}, removed {sorted(before.keys() - after.keys())}, "
            f"changed {changed}")
