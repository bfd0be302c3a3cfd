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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from fedhet.config import ExperimentConfig
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import require_flower

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
    """A SuperLink and `num_nodes` SuperNodes on 127.0.0.1, stopped on exit even after errors."""

    def __init__(self, num_nodes: int, workdir: str | Path, port: int | None = None,
                 extra_node_config: str = "") -> None:
        self.num_nodes, self.workdir = num_nodes, Path(workdir)
        self.port = port or free_port()
        self.extra_node_config = extra_node_config
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.procs: list[subprocess.Popen] = []
        self.env = {"FLWR_TELEMETRY_ENABLED": "0", **os.environ, "FLWR_HOME": str(self.flwr_home),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
                                start_new_session=True)  # own process group: stop() takes its children too
        out.close()
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 120.0) -> LocalFederation:
        require_flower()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        try:
            link = self._spawn("superlink", [_bin("flower-superlink"), "--insecure", "--port", str(self.port),
                                             "--disable-runtime-dependency-installation"])
            _wait_for_port(self.port, timeout, link, self.logs / "superlink.log")
            for i in range(self.num_nodes):
                node_config = f"partition-id={i} num-partitions={self.num_nodes} {self.extra_node_config}".strip()
                self._spawn(f"supernode-{i}", [_bin("flower-supernode"), "--insecure", "--superlink", self.address,
                                               "--port", str(free_port()), "--node-config", node_config])
        except BaseException:
            self.stop()
            raise
        self.write_connection()
        return self

    def write_connection(self) -> Path:
        """Flower's CLI config (FLWR_HOME/config.toml) with this SuperLink as the default connection."""
        path = self.flwr_home / "config.toml"
        path.write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                        f'address = "{self.address}"\ninsecure = true\n')
        return path

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise FedhetError(f"a Flower process exited early ({proc.args[0]}, code {proc.returncode}); "
                                  f"see the logs in {self.logs}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after `grace` seconds."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # children (ServerApp / ClientApp processes) too
            proc.wait()
        self.procs.clear()

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


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON string escapes are valid TOML escapes)."""
    return json.dumps(text, ensure_ascii=True)


def write_flower_app(folder: str | Path, config: dict, run_dir: str | Path, timeout: float = 3600.0) -> Path:
    """A Flower App folder whose ServerApp / ClientApp are fedhet's, with the experiment in its run config."""
    from fedhet import __version__

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedhet-flower-app"
version = "1.0.0"
description = "fedhet experiment {config.get('name', '')} ({config.get('method', '')}) on Flower"
license = "Apache-2.0"
# fedhet[flower] {__version__} must be installed where the SuperLink and SuperNodes run
dependencies = []

[tool.flwr.app]
publisher = "fedhet"

[tool.flwr.app.components]
serverapp = "fedhet.runtimes.flower.app:server_app"
clientapp = "fedhet.runtimes.flower.app:client_app"

[tool.flwr.app.config]
fedhet-config = {_toml_string(json.dumps(config))}
run-dir = {_toml_string(str(Path(run_dir).resolve()))}
timeout = {float(timeout)}
wait-for-nodes = 300.0
""")
    (folder / "README.md").write_text("Generated by `fedhet flower`; the apps live in fedhet.runtimes.flower.app.\n")
    return folder


def flwr_run(app_dir: Path, federation: LocalFederation, timeout: float) -> None:
    """`flwr run APP CONNECTION --stream`, failing clearly when it, or a Flower process, fails."""
    log_path = federation.logs / "flwr-run.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream"], stdout=out,
                                stderr=subprocess.STDOUT, env=federation.env, cwd=federation.workdir,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise FedhetError(f"`flwr run` did not finish within {timeout:.0f} s; see {federation.logs}") from err
        finally:
            _signal_group(proc, signal.SIGKILL)
    if proc.returncode != 0:
        raise FedhetError(f"`flwr run` failed with code {proc.returncode}; see {log_path}")


def deploy_experiment(cfg: ExperimentConfig, run_dir: str | Path, workdir: str | Path | None = None,
                      port: int | None = None, timeout: float = 3600.0) -> Path:
    """Run `cfg` on a fresh local SuperLink + one SuperNode per client; returns the run directory.

    Everything Flower writes (the App folder, logs, FLWR_HOME with config.toml and the installed FAB) goes to
    `workdir` (default: a new temporary folder, left in place for its logs)."""
    from fedhet.data import build_federated_data

    run_dir = Path(run_dir).resolve()
    config = cfg.to_dict()
    config["run"]["runtime"] = "flower"
    num_clients = len(build_federated_data(cfg.data, cfg.seed).clients)
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fedhet-flower-"))
    app_dir = write_flower_app(work / "app", config, run_dir, timeout=timeout)
    with LocalFederation(num_clients, work, port=port) as federation:
        flwr_run(app_dir, federation, timeout)
    if not (run_dir / "summary.json").is_file():
        raise FedhetError(f"the Flower run ended without writing {run_dir / 'summary.json'}; see the logs in "
                          f"{work / 'logs'}")
    return run_dir
