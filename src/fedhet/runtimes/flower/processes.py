"""The local processes of a Flower deployment: executables, ports, process groups and whole process trees."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from fedhet.errors import FedhetError


def executable(name: str) -> str:
    """A Flower executable next to this interpreter (the venv), else from PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FedhetError(f"flower-superlink exited with code {proc.returncode}; see {log_path}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise FedhetError(f"flower-superlink did not listen on 127.0.0.1:{port} within {timeout:.0f} s; see {log_path}")


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_pids(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def alive(pid: int) -> bool:
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
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def stop_process_trees(procs: Iterable[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM `procs` (each the leader of its own process group) and all their descendants, then SIGKILL what is
    left after `grace` seconds. Descendants are collected first: Flower starts its SuperExecs in new sessions
    (other process groups), and their ServerApp / ClientApp processes outlive a killed parent."""
    procs = list(procs)
    family = {d for proc in procs if proc.poll() is None for d in descendants(proc.pid)}
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    signal_pids(family, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
        signal_group(proc, signal.SIGKILL)  # children (ServerApp / ClientApp processes) too
        proc.wait()
    while family and time.monotonic() < deadline:
        family = {pid for pid in family if alive(pid)}
        time.sleep(0.2)
    signal_pids(family, signal.SIGKILL)
