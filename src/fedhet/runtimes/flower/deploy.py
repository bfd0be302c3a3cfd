"""Deployment on one machine over Flower's real transport: a SuperLink, K SuperNodes and `flwr run`.

`LocalFederation` starts `flower-superlink` and one `flower-supernode` per client on 127.0.0.1 (SuperNode i
holds partition i), each in its own process group, and always stops them (`with` block / `stop()`).
`deploy_experiment` writes a Flower App folder (pyproject.toml whose components are fedhet's ServerApp /
ClientApp and whose run config carries the resolved experiment), runs it with `flwr run --stream` and returns
the run directory the ServerApp wrote. Flower's own files (config.toml with the SuperLink connection, FABs)
go to a private FLWR_HOME, never to ~/.flwr.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from fedhet.config import ExperimentConfig
from fedhet.engine.loop import Interrupted
from fedhet.engine.rundir import RunDirectory, check_writable_path, start_check
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import require_flower
from fedhet.runtimes.flower.tls import CA, TlsFiles, make_self_signed

log = logging.getLogger(__name__)
CONNECTION = "fedhet-local"


def _bin(name: str) -> str:
    """A Flower executable next to this interpreter (the venv), else from PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, timeout: float, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FedhetError(f"flower-superlink exited with code {proc.returncode}; see {log_path}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise FedhetError(f"flower-superlink did not listen on 127.0.0.1:{port} within {timeout:.0f} s; see {log_path}")


class LocalFederation:
    """A SuperLink and `num_nodes` SuperNodes on 127.0.0.1, stopped on exit even after errors.

    With `tls` (a `TlsFiles`), the SuperLink serves HTTPS with that certificate, the SuperNodes and `flwr`
    verify it with the CA certificate (`--root-certificates`, config `root-certificates`); else everything
    runs `--insecure`. `task_poll_interval` sets Flower's FLWR_SUPEREXEC_TASK_POLL_INTERVAL (seconds between
    the SuperExecs' checks for a new ServerApp / ClientApp task; Flower's default 1 s). With `workers`, a
    `fedhet flower worker` runs beside each SuperNode (socket `<workdir>/workers/node<i>.sock`, named in the
    node config as `fedhet-worker`) and the lean ClientApp of `node_app` forwards every message to it."""

    def __init__(self, num_nodes: int, workdir: str | Path, port: int | None = None,
                 extra_node_config: str = "", tls: TlsFiles | None = None,
                 task_poll_interval: float | None = None, workers: bool = False) -> None:
        self.num_nodes, self.workdir = num_nodes, Path(workdir)
        self.workers = workers
        self._socket_dir: Path | None = None
        self.port = port or free_port()
        self.extra_node_config = extra_node_config
        self.tls = tls
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.procs: list[subprocess.Popen] = []
        self.env = {"FLWR_TELEMETRY_ENABLED": "0", **os.environ, "FLWR_HOME": str(self.flwr_home),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        if task_poll_interval is not None:
            self.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(task_poll_interval)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
                                start_new_session=True)  # own process group: stop() takes its children too
        out.close()
        proc.fedhet_name = name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def _link_security(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        return ["--ssl-ca-certfile", str(self.tls.ca), "--ssl-certfile", str(self.tls.cert),
                "--ssl-keyfile", str(self.tls.key)]

    def _node_security(self) -> list[str]:
        return ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls.ca)]

    def start(self, timeout: float = 120.0) -> LocalFederation:
        require_flower()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        try:
            link = self._spawn("superlink", [_bin("flower-superlink"), *self._link_security(), "--port", str(self.port),
                                             "--disable-runtime-dependency-installation"])
            _wait_for_port(self.port, timeout, link, self.logs / "superlink.log")
            for i in range(self.num_nodes):
                if self.workers:
                    self.start_worker(i, timeout)
                self.start_node(i)
        except BaseException:
            self.stop()
            raise
        self.write_connection()
        return self

    def worker_socket(self, partition: int) -> Path:
        """`<workdir>/workers/node<i>.sock`, or under a short temporary folder when that path is too long for
        a Unix socket (about 100 bytes)."""
        folder = self.workdir.resolve() / "workers"
        if len(str(folder)) > 80:
            if self._socket_dir is None:
                self._socket_dir = Path(tempfile.mkdtemp(prefix="fedhet-w-"))
            folder = self._socket_dir
        return folder / f"node{partition}.sock"

    def start_worker(self, partition: int, timeout: float = 120.0) -> subprocess.Popen:
        """Start the fedhet worker of `partition` and wait until its socket exists."""
        sock = self.worker_socket(partition)
        proc = self._spawn(f"worker-{partition}", [sys.executable, "-m", "fedhet.cli", "flower", "worker",
                                                   "--socket", str(sock)])
        deadline = time.monotonic() + timeout
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self.logs / f"worker-{partition}.log").read_text(errors="replace")[-2000:]
                raise FedhetError(f"the fedhet worker for node {partition} did not start:\n{log_text}")
            time.sleep(0.1)
        return proc

    def start_node(self, partition: int) -> subprocess.Popen:
        """Start the SuperNode holding `partition` (also to restart one that was killed)."""
        worker = f' fedhet-worker="{self.worker_socket(partition)}"' if self.workers else ""
        node_config = (f"partition-id={partition} num-partitions={self.num_nodes}{worker} "
                       f"{self.extra_node_config}").strip()
        return self._spawn(f"supernode-{partition}", [_bin("flower-supernode"), *self._node_security(),
                                                      "--superlink", self.address, "--port", str(free_port()),
                                                      "--node-config", node_config])

    def node_process(self, partition: int) -> subprocess.Popen:
        """The (latest) SuperNode process of `partition`."""
        name = f"supernode-{partition}"
        return next(p for p in reversed(self.procs) if getattr(p, "fedhet_name", "") == name)

    def kill_node(self, partition: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` to the SuperNode of `partition` and its ClientApp processes (fault injection)."""
        proc = self.node_process(partition)
        _signal_group(proc, sig)
        proc.wait(timeout=30)

    def write_connection(self) -> Path:
        """Flower's CLI config (FLWR_HOME/config.toml) with this SuperLink as the default connection."""
        path = self.flwr_home / "config.toml"
        security = "insecure = true" if self.tls is None else f"root-certificates = {_toml_string(str(self.tls.ca))}"
        path.write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                        f'address = "{self.address}"\n{security}\n')
        return path

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise FedhetError(f"a Flower process exited early ({proc.args[0]}, code {proc.returncode}); "
                                  f"see the logs in {self.logs}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process this federation started and all their descendants, then SIGKILL what is left
        after `grace` seconds. Descendants are collected first: Flower starts its SuperExecs in new sessions
        (other process groups), and their ServerApp / ClientApp processes outlive a killed parent."""
        family = {d for proc in self.procs if proc.poll() is None for d in descendants(proc.pid)}
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        _signal_pids(family, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # children (ServerApp / ClientApp processes) too
            proc.wait()
        while family and time.monotonic() < deadline:
            family = {pid for pid in family if _alive(pid)}
            time.sleep(0.2)
        _signal_pids(family, signal.SIGKILL)
        self.procs.clear()
        if self._socket_dir is not None:  # the short folder of worker sockets (see worker_socket)
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> LocalFederation:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_pids(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def descendants(pid: int) -> set[int]:
    """The ids of every process below `pid` (children, grandchildren, ...), from `ps`."""
    try:
        out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON string escapes are valid TOML escapes)."""
    return json.dumps(text, ensure_ascii=True)


def _toml_value(value: str | float | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    return repr(value)


def flower_app_pyproject(name: str, description: str, module: str, app_config: str, note: str = "",
                         client_module: str | None = None) -> str:
    """A Flower App's pyproject.toml: ServerApp / ClientApp `module:server_app` / `client_module:client_app`
    (default: `module`), the `[tool.flwr.app.config]` lines `app_config`, no dependencies (the SuperLink's
    runtime install is off)."""
    note_line = f"{note}\n" if note else ""
    return f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "{description}"
license = "Apache-2.0"
{note_line}dependencies = []

[tool.flwr.app]
publisher = "fedhet"

[tool.flwr.app.components]
serverapp = "{module}:server_app"
clientapp = "{client_module or module}:client_app"

[tool.flwr.app.config]
{app_config}
"""


def write_flower_app(folder: str | Path, config: dict, run_dir: str | Path, client_state_dir: str = "",
                     resume: bool = False, stop_after: int = 0, poll_interval: float = 0.2) -> Path:
    """A Flower App folder whose ServerApp / ClientApp are fedhet's, with the experiment in its run config."""
    from fedhet import __version__
    from fedhet.runtimes.flower.app import FlowerSettings

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    settings = FlowerSettings(config=config, run_dir=str(Path(run_dir).resolve()), client_state_dir=client_state_dir,
                              resume=resume, stop_after=stop_after, poll_interval=poll_interval)
    run_config = "\n".join(f"{k} = {_toml_value(v)}" for k, v in settings.to_run_config().items())
    (folder / "pyproject.toml").write_text(flower_app_pyproject(
        "fedhet-flower-app", f"fedhet experiment {config.get('name', '')} ({config.get('method', '')}) on Flower",
        "fedhet.runtimes.flower.app", run_config,
        note=f"# fedhet[flower] {__version__} must be installed where the SuperLink and SuperNodes run",
        client_module="fedhet.runtimes.flower.node_app"))
    (folder / "README.md").write_text("Generated by `fedhet flower`; the apps live in fedhet.runtimes.flower.app "
                                      "(ServerApp) and fedhet.runtimes.flower.node_app (ClientApp).\n")
    return folder


def flwr_run(app_dir: Path, federation: LocalFederation, timeout: float) -> None:
    """`flwr run APP CONNECTION --stream`, failing clearly when it, or a Flower process, fails."""
    log_path = federation.logs / "flwr-run.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream"], stdout=out,
                                stderr=subprocess.STDOUT, env=federation.env, cwd=federation.workdir,
                                start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise FedhetError(f"`flwr run` did not finish within {timeout:.0f} s; see {federation.logs}")
                _check_task_starts(federation.logs)
                time.sleep(1.0)
        finally:
            _signal_group(proc, signal.SIGKILL)
    if proc.returncode != 0:
        raise FedhetError(f"`flwr run` failed with code {proc.returncode}; see {log_path}")


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
                      poll_interval: float = 0.2, task_poll_interval: float | None = None,
                      workers: bool = True) -> Path:
    """Run `cfg` on a fresh local SuperLink + one SuperNode per client; returns the run directory.

    Everything Flower writes (the App folder, logs, FLWR_HOME with config.toml and the installed FAB) goes to
    `workdir` (default: a new temporary folder, left in place for its logs); the clients keep their per-round
    states in `<run_dir>/client_states/`, so `resume=True` continues a stopped or interrupted run from its
    checkpoint. `timeout` bounds the whole `flwr run`; `tls_dir` holds ca.crt / server.pem / server.key
    (see `tls`), and is filled with self-signed ones for 127.0.0.1 when it holds none. `poll_interval`: seconds
    between the ServerApp's pulls for replies; `task_poll_interval`, `workers` (a fedhet worker beside each
    SuperNode, so ClientApp processes do not import torch and rebuild the experiment per message): see
    `LocalFederation`."""
    from fedhet.data import build_federated_data
    from fedhet.runtimes.flower.server import STOPPED_FILE

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
                               resume=resume, stop_after=stop_after or 0, poll_interval=poll_interval)
    started = time.time()
    federation = LocalFederation(num_clients, work, port=port, tls=tls, task_poll_interval=task_poll_interval,
                                 workers=workers)
    try:
        with federation:
            flwr_run(app_dir, federation, timeout)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(checkpoint, started)) from None
    except FedhetError:
        _raise_if_stopped(run_dir / STOPPED_FILE, started)
        raise
    _raise_if_stopped(run_dir / STOPPED_FILE, started)
    finished = (run_dir / "summary.json").is_file() or (stop_after and checkpoint.is_file())
    if not finished:
        raise FedhetError(f"the Flower run ended without writing {run_dir / 'summary.json'}; see the logs in "
                          f"{work / 'logs'}")
    return run_dir


def _raise_if_stopped(stopped: Path, since: float) -> None:
    """Raise the ServerApp's own error when it stopped the run (too few valid replies) during this deployment."""
    from fedhet.runtimes.flower.server import RoundFailed

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
    import torch

    rnd = torch.load(checkpoint, map_location="cpu", weights_only=False)["round"]
    return f"interrupted; the checkpoint of round {rnd} is {checkpoint}. Continue with --resume."
