"""`LocalFederation`: a Flower SuperLink and K SuperNodes on 127.0.0.1, each in its own process group, always
stopped (`with` block / `stop()`), with Flower's own files in a private FLWR_HOME instead of ~/.flwr."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from fedhet.errors import ConfigError, FedhetError
from fedhet.runtimes.flower import require_flower
from fedhet.runtimes.flower.app_folder import toml_string
from fedhet.runtimes.flower.node_auth import make_node_key, register_node_keys
from fedhet.runtimes.flower.processes import executable, free_port, signal_group, stop_process_trees, wait_for_port
from fedhet.runtimes.flower.tls import TlsFiles

CONNECTION = "fedhet-local"


def link_security(tls: TlsFiles | None) -> list[str]:
    """The SuperLink's TLS flags (`--insecure` without TLS)."""
    if tls is None:
        return ["--insecure"]
    return ["--ssl-ca-certfile", str(tls.ca), "--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key)]


def node_security(tls: TlsFiles | None) -> list[str]:
    """A SuperNode's TLS flags: verify the SuperLink with the CA certificate (`--insecure` without TLS)."""
    return ["--insecure"] if tls is None else ["--root-certificates", str(tls.ca)]


def superexec(port: int, tls: TlsFiles | None) -> list[str]:
    """`flower-superexec` for the Runtime API on `port` (isolation "process"), verifying it with `tls`'s CA."""
    return [executable("flower-superexec"), *node_security(tls), "--runtime-api-address", f"127.0.0.1:{port}"]


def write_connection(flwr_home: Path, address: str, tls: TlsFiles | None) -> None:
    """Flower's CLI config (FLWR_HOME/config.toml) with the SuperLink at `address` as the default connection."""
    security = "insecure = true" if tls is None else f"root-certificates = {toml_string(str(tls.ca))}"
    (flwr_home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                                           f'address = "{address}"\n{security}\n')


TASK_POLL_INTERVAL = 0.2  # seconds; Flower's default is 1 s (docs/results/runtimes.md, "Deployment speed")
ISOLATIONS = ("subprocess", "process")


class LocalFederation:
    """A SuperLink and `num_nodes` SuperNodes on 127.0.0.1, stopped on exit even after errors.

    With `tls` (a `TlsFiles`), the SuperLink serves HTTPS with that certificate, the SuperNodes and `flwr`
    verify it with the CA certificate (`--root-certificates`, config `root-certificates`); else everything
    runs `--insecure`. `task_poll_interval` sets Flower's FLWR_SUPEREXEC_TASK_POLL_INTERVAL (seconds between
    the SuperExecs' checks for a new ServerApp / ClientApp task; None: Flower's default, 1 s). `isolation`
    "process" starts the SuperLink and SuperNodes with `--isolation process` and runs their `flower-superexec`
    as separate processes (Flower's default "subprocess": each starts its own). `supernode_auth` (needs `tls`)
    starts the SuperLink with `--enable-supernode-auth` and registers a fresh key pair per SuperNode
    (`<workdir>/node-keys`, node_auth.py). With `workers`, a `fedhet flower worker` runs beside each SuperNode
    (socket `<workdir>/workers/node<i>.sock`, named in the node config as `fedhet-worker`) and the lean
    ClientApp of `node_app` forwards every message to it. `extra_node_config`: more node config, the same for every
    SuperNode or a list with one entry per SuperNode (node-data: `data-root=... client-id=...`, local_data.py)."""

    def __init__(self, num_nodes: int, workdir: str | Path, port: int | None = None,
                 extra_node_config: str | list[str] = "", tls: TlsFiles | None = None,
                 task_poll_interval: float | None = TASK_POLL_INTERVAL, workers: bool = False,
                 isolation: str = "subprocess", supernode_auth: bool = False) -> None:
        if isolation not in ISOLATIONS:
            raise ConfigError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        if supernode_auth and tls is None:
            raise ConfigError("SuperNode authentication needs TLS (Flower refuses it over --insecure); give tls too")
        self.num_nodes, self.workdir = num_nodes, Path(workdir)
        self.workers, self.isolation, self.supernode_auth = workers, isolation, supernode_auth
        self._socket_dir: Path | None = None
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.extra_node_config, self.tls = extra_node_config, tls
        self.flwr_home, self.logs, self.node_keys = (self.workdir / "flwr-home", self.workdir / "logs",
                                                     self.workdir / "node-keys")
        self.procs: list[subprocess.Popen[bytes]] = []
        self._latest: dict[str, subprocess.Popen[bytes]] = {}  # name ("supernode-0", ...) -> its latest process
        self.env = {"FLWR_TELEMETRY_ENABLED": "0", **os.environ, "FLWR_HOME": str(self.flwr_home),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        if task_poll_interval is not None:
            self.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(task_poll_interval)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
                                start_new_session=True)  # own process group: stop() takes its children too
        out.close()
        self._latest[name] = proc
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 120.0) -> LocalFederation:
        require_flower()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        try:
            extra = ["--enable-supernode-auth"] if self.supernode_auth else []
            link = self._spawn("superlink", [executable("flower-superlink"), *link_security(self.tls), *extra,
                                             "--isolation", self.isolation, "--port", str(self.port),
                                             "--disable-runtime-dependency-installation"])
            wait_for_port(self.port, timeout, link, self.logs / "superlink.log")
            if self.isolation == "process":
                self._spawn("superexec-link", superexec(self.port, self.tls))
            write_connection(self.flwr_home, self.address, self.tls)
            if self.supernode_auth:
                keys = [make_node_key(self.node_keys, f"node{i}")[1] for i in range(self.num_nodes)]
                register_node_keys(executable("flwr"), keys, CONNECTION, self.env, self.workdir)
            for i in range(self.num_nodes):
                if self.workers:
                    self.start_worker(i, timeout)
                self.start_node(i)
        except BaseException:
            self.stop()
            raise
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

    def start_worker(self, partition: int, timeout: float = 120.0) -> subprocess.Popen[bytes]:
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

    def start_node(self, partition: int, auth_key: Path | None = None) -> subprocess.Popen[bytes]:
        """Start the SuperNode holding `partition` (also to restart one that was killed); with SuperNode
        authentication it signs with `auth_key` (default: its registered `<workdir>/node-keys/node<i>`)."""
        worker = f' fedhet-worker="{self.worker_socket(partition)}"' if self.workers else ""
        extra = self.extra_node_config  # one string for all nodes, or one per node (e.g. each site's data-root)
        extra = extra[partition] if isinstance(extra, list) else extra
        node_config = f"partition-id={partition} num-partitions={self.num_nodes}{worker} {extra}".strip()
        key = auth_key or (self.node_keys / f"node{partition}" if self.supernode_auth else None)
        auth = [] if key is None else ["--auth-supernode-private-key", str(key)]
        runtime_port = free_port()
        node = self._spawn(f"supernode-{partition}", [executable("flower-supernode"), *node_security(self.tls), *auth,
                                                      "--superlink", self.address, "--isolation", self.isolation,
                                                      "--port", str(runtime_port), "--node-config", node_config])
        if self.isolation == "process":
            self._spawn(f"superexec-{partition}", superexec(runtime_port, None))
        return node

    def node_process(self, partition: int, kind: str = "supernode") -> subprocess.Popen[bytes]:
        """The latest process `kind` ("supernode", "superexec", "worker") started for `partition`."""
        proc = self._latest.get(f"{kind}-{partition}")
        if proc is None:
            raise FedhetError(f"no {kind} was started for partition {partition}")
        return proc

    def kill_node(self, partition: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` to the SuperNode of `partition` and its ClientApp processes (fault injection); with
        isolation "process" also to its SuperExec (start_node starts a new one)."""
        kinds = ("supernode", "superexec") if self.isolation == "process" else ("supernode",)
        for kind in kinds:
            proc = self.node_process(partition, kind)
            signal_group(proc, sig)
            proc.wait(timeout=30)

    def stop(self, grace: float = 10.0) -> None:
        """Stop every process this federation started and all their descendants (`stop_process_trees`)."""
        stop_process_trees(self.procs, grace)
        self.procs.clear()
        self._latest.clear()
        if self._socket_dir is not None:  # the short folder of worker sockets (see worker_socket)
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> LocalFederation:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
