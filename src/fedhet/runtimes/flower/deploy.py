"""Deployment on one machine over Flower's real transport: a SuperLink, K SuperNodes and `flwr run`.

`LocalFederation` (federation.py) starts `flower-superlink` and one `flower-supernode` per client on 127.0.0.1
(SuperNode i holds partition i), each in its own process group, and always stops them (`with` block / `stop()`).
`deploy_experiment` writes a Flower App folder (app_folder.py: pyproject.toml whose components are fedhet's
ServerApp / ClientApp and whose run config carries the resolved experiment), runs it with `flwr run --stream`
and returns the run directory the ServerApp wrote. Flower's own files (config.toml with the SuperLink
connection, FABs) go to a private FLWR_HOME, never to ~/.flwr.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from fedhet.config import ExperimentConfig
from fedhet.engine.loop import Interrupted
from fedhet.engine.rundir import RunDirectory, check_writable_path, start_check
from fedhet.errors import FedhetError
from fedhet.runtimes.flower.app_folder import flower_app_pyproject, write_flower_app
from fedhet.runtimes.flower.federation import CONNECTION, TASK_POLL_INTERVAL, LocalFederation
from fedhet.runtimes.flower.processes import descendants, executable, free_port, signal_group
from fedhet.runtimes.flower.tls import CA, TlsFiles, make_self_signed

__all__ = ["CONNECTION", "LocalFederation", "ProgressEcho", "deploy_experiment", "descendants", "flower_app_pyproject",
           "flwr_run", "free_port", "write_flower_app"]

log = logging.getLogger(__name__)
PROGRESS_MARK = "[fedhet]"  # the ServerApp's progress lines start with it
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ProgressEcho:
    """Follows a growing log file and writes each new complete line holding `mark` (from the mark on, colour
    codes removed) to `out`: the ServerApp's "[fedhet] round ..." lines as `flwr run --stream` receives them."""

    def __init__(self, path: Path, out: TextIO | None = None, mark: str = PROGRESS_MARK) -> None:
        self.path, self.out, self.mark = path, out, mark
        self.offset, self.partial = 0, b""

    def poll(self) -> list[str]:
        """Echo (and return) the marked lines completed since the last call."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        found = []
        for raw in lines:
            line = ANSI.sub("", raw.decode(errors="replace")).rstrip()
            if self.mark in line:
                found.append(line[line.index(self.mark):])
        if found:
            print("\n".join(found), file=self.out or sys.stderr, flush=True)
        return found


def flwr_run(app_dir: Path, federation: LocalFederation, timeout: float, progress: bool = False) -> None:
    """`flwr run APP CONNECTION --stream`, failing clearly when it, or a Flower process, fails; with
    `progress`, the ServerApp's "[fedhet] ..." lines are echoed to stderr as they arrive (`ProgressEcho`)."""
    log_path = federation.logs / "flwr-run.log"
    echo = ProgressEcho(log_path) if progress else None
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([executable("flwr"), "run", str(app_dir), CONNECTION, "--stream"], stdout=out,
                                stderr=subprocess.STDOUT, env=federation.env, cwd=federation.workdir,
                                start_new_session=True)
        if echo is not None:
            _say(f"run submitted (flwr run --stream, log {log_path}); waiting for the ServerApp's first round")
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise FedhetError(f"`flwr run` did not finish within {timeout:.0f} s; see {federation.logs}")
                _check_task_starts(federation.logs)
                if echo is not None:
                    echo.poll()
                time.sleep(0.5)
        finally:
            signal_group(proc, signal.SIGKILL)
            if echo is not None:
                echo.poll()
    if proc.returncode != 0:
        raise FedhetError(f"`flwr run` failed with code {proc.returncode}; see {log_path}")


def _say(line: str) -> None:
    print(f"{PROGRESS_MARK} {line}", file=sys.stderr, flush=True)


def _check_task_starts(logs: Path, limit: int = 6) -> None:
    """Fail clearly when Flower keeps relaunching a ServerApp / ClientApp process that does not check in within
    Flower's task-token window (30 s in flwr 1.41): seen on a heavily overloaded machine, where it never ends."""
    failures = 0
    for path in logs.glob("super*.log"):
        with open(path, "rb") as fh:
            fh.seek(max(path.stat().st_size - 200_000, 0))
            failures += fh.read().count(b"task-token authentication failed")
    if failures >= limit:
        raise FedhetError(f"Flower relaunched ServerApp / ClientApp processes that did not start within its 30 s "
                          f"task-token window ({failures} authentication failures in {logs}); the machine is "
                          "probably overloaded. Retry with less load.")


def deploy_experiment(cfg: ExperimentConfig, run_dir: str | Path, workdir: str | Path | None = None,
                      port: int | None = None, timeout: float = 3600.0, resume: bool = False,
                      stop_after: int | None = None, tls_dir: str | Path | None = None,
                      poll_interval: float = 0.2, task_poll_interval: float | None = TASK_POLL_INTERVAL,
                      workers: bool = True, isolation: str = "subprocess", supernode_auth: bool = False,
                      progress: bool | None = None) -> Path:
    """Run `cfg` on a fresh local SuperLink + one SuperNode per client; returns the run directory.

    Everything Flower writes (the App folder, logs, FLWR_HOME with config.toml and the installed FAB) goes to
    `workdir` (default: a new temporary folder, left in place for its logs); the clients keep their per-round
    states in `<run_dir>/client_states/`, so `resume=True` continues a stopped or interrupted run from its
    checkpoint. `timeout` bounds the whole `flwr run`; `tls_dir` holds ca.crt / server.pem / server.key
    (see `tls`), and is filled with self-signed ones for 127.0.0.1 when it holds none. `poll_interval`: seconds
    between the ServerApp's pulls for replies; `task_poll_interval` (None: Flower's 1 s), `isolation`,
    `supernode_auth` (needs `tls_dir`), `workers` (a fedhet worker beside each SuperNode, so ClientApp
    processes do not import torch and rebuild the experiment per message): see `LocalFederation`.
    `progress`: echo the ServerApp's "[fedhet] round ..." lines to stderr as they arrive (default: unless
    `run.quiet`)."""
    from fedhet.data import build_federated_data
    from fedhet.runtimes.flower.faults import STOPPED_FILE

    run_dir = Path(run_dir).resolve()
    check_writable_path(run_dir)
    start_check(run_dir, resume)
    checkpoint = RunDirectory(run_dir).latest_checkpoint
    config = cfg.to_dict()
    config["run"]["runtime"] = "flower"
    num_clients = len(build_federated_data(cfg.data, cfg.seed).clients)
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fedhet-flower-"))
    tls = None
    if tls_dir is not None:
        if not (Path(tls_dir) / CA).is_file():
            log.warning("no certificates in %s: writing a self-signed CA and server certificate for 127.0.0.1",
                        tls_dir)
            make_self_signed(tls_dir)
        tls = TlsFiles.in_dir(tls_dir)
    app_dir = write_flower_app(work / "app", config, run_dir, client_state_dir=str(run_dir / "client_states"),
                               resume=resume, stop_after=stop_after or 0, poll_interval=poll_interval,
                               per_run_dir=False)
    started, show = time.time(), not cfg.run.quiet if progress is None else progress
    if show:
        _say(f"starting a SuperLink and {num_clients} SuperNodes on 127.0.0.1 (Flower's logs: {work / 'logs'})")
    federation = LocalFederation(num_clients, work, port=port, tls=tls, task_poll_interval=task_poll_interval,
                                 workers=workers, isolation=isolation, supernode_auth=supernode_auth)
    try:
        with federation:
            flwr_run(app_dir, federation, timeout, progress=show)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(checkpoint, started)) from None
    except FedhetError:
        _raise_if_stopped(run_dir / STOPPED_FILE, started)
        raise
    _raise_if_stopped(run_dir / STOPPED_FILE, started)
    finished = (run_dir / "summary.json").is_file() or (stop_after and checkpoint.is_file())
    if not finished:
        reason = serverapp_error(work / "logs" / "flwr-run.log")
        raise FedhetError(f"the Flower run ended without writing {run_dir / 'summary.json'}"
                          f"{f': {reason}' if reason else ''}; see the logs in {work / 'logs'}")
    return run_dir


def serverapp_error(log_path: Path) -> str:
    """The reason of the ServerApp's `[fedhet] ERROR: ...` line in a `flwr run --stream` log ('' if none): `flwr
    run` exits 0 also when the ServerApp fails (docs/deployment.md)."""
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    found = re.findall(rf"{re.escape(PROGRESS_MARK)} ERROR: (.*)", text)
    return found[-1].strip() if found else ""


def _raise_if_stopped(stopped: Path, since: float) -> None:
    """Raise the ServerApp's own error when it stopped the run (too few valid replies) during this deployment."""
    from fedhet.runtimes.flower.faults import RoundFailed

    if stopped.is_file() and stopped.stat().st_mtime >= since - 1:
        raise RoundFailed(json.loads(stopped.read_text())["error"])


def _interrupted_message(checkpoint: Path, since: float, wait: float = 15.0) -> str:
    """After Ctrl-C: the ServerApp (stopped through its parent processes) writes its checkpoint; wait for it."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if checkpoint.is_file() and checkpoint.stat().st_mtime >= since:
            break
        time.sleep(0.5)
    if not checkpoint.is_file():
        return "interrupted before the first checkpoint; start again"
    from fedhet.engine.safe_load import load_trusted

    rnd = load_trusted(checkpoint, f"checkpoint '{checkpoint}'")["round"]
    return f"interrupted; the checkpoint of round {rnd} is {checkpoint}. Continue with --resume."
