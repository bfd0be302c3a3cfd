"""The lean deployment ClientApp (`node_app`) and the fedhet worker: errors reach the ClientApp clearly, and
nothing either side receives (nor a client state it reads back) can run code."""

from __future__ import annotations

import os
import pickle
import shlex
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.runtimes.flower import node_app  # noqa: E402
from fedhet.runtimes.flower.app import FlowerSettings  # noqa: E402
from fedhet.runtimes.flower.worker import Worker  # noqa: E402


def _context(sock: str, partition: int = 1) -> Context:
    config = load_config(None, ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}"])
    return Context(run_id=1, node_id=7, state=RecordDict({"keep": ConfigRecord({"x": 1})}),
                   run_config=FlowerSettings(config=config.to_dict()).to_run_config(),
                   node_config={"partition-id": partition, "num-partitions": 4, node_app.WORKER_KEY: sock})


def _partition(reply: RecordDict) -> object:
    """The client a query reply names (Flower's node config key, in the reply's ConfigRecord)."""
    return reply["config"]["partition-id"]


@pytest.fixture
def worker_socket() -> Iterator[Path]:
    """A worker serving in a thread; its socket path (the key beside it)."""
    sock = Path(tempfile.mkdtemp(prefix="fedhet-test-w-")) / "node.sock"
    worker, ready = Worker(sock), threading.Event()
    thread = threading.Thread(target=worker.serve, args=(ready,), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield sock
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_worker_answers_and_reports_failures(worker_socket: Path) -> None:
    context = _context(str(worker_socket))
    reply = node_app.forward("query", RecordDict(), context)
    assert _partition(reply) == 1
    assert context.state["keep"]["x"] == 1  # the state made the round trip
    with pytest.raises(RuntimeError, match="failed on a bogus message: ValueError: unknown message kind"):
        node_app.forward("bogus", RecordDict(), context)
    with pytest.raises(RuntimeError, match="failed on a query message: .*partition-id 9"):
        node_app.forward("query", RecordDict(), _context(str(worker_socket), partition=9))
    assert _partition(node_app.forward("query", RecordDict(), context)) == 1  # still serving


def test_missing_worker_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="no fedhet worker answers at .*fedhet flower worker --socket"):
        node_app.forward("query", RecordDict(), _context(str(tmp_path / "absent.sock")))


def test_worker_channel_refuses_a_peer_without_the_key_before_unpickling(tmp_path) -> None:
    """A local process that cannot read `<socket>.key` cannot make the worker unpickle anything: a crafted
    pickle (one that would run code when loaded) sent without the key is refused at the HMAC challenge, and the
    worker goes on serving the ClientApp, which has the key."""
    import pickle
    import stat
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    from fedhet.runtimes.flower.worker_key import key_path

    sock = Path(tempfile.mkdtemp(prefix="fedhet-test-w-")) / "node.sock"
    worker, ready = Worker(sock), threading.Event()
    thread = threading.Thread(target=worker.serve, args=(ready,), daemon=True)
    thread.start()
    assert ready.wait(10)
    marker = tmp_path / "pwned"

    class Crafted:
        def __reduce__(self):  # unpickling this calls open(marker, "w")
            return (open, (str(marker), "w"))

    try:
        assert stat.S_IMODE(key_path(sock).stat().st_mode) == 0o600
        for key in (None, b"wrong key"):
            with pytest.raises((AuthenticationError, EOFError, ConnectionError, pickle.UnpicklingError)):
                conn = Client(str(sock), family="AF_UNIX", authkey=key)
                conn.send_bytes(pickle.dumps(("query", Crafted(), None)))
                conn.recv()
        assert not marker.exists()
        assert _partition(node_app.forward("query", RecordDict(), _context(str(sock)))) == 1
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive() and not key_path(sock).exists()


def test_a_missing_worker_key_is_a_clear_error(tmp_path) -> None:
    sock = tmp_path / "node.sock"
    sock.touch()  # a socket path exists, but no key beside it (another user's worker, or a stale path)
    with pytest.raises(RuntimeError, match="cannot read the fedhet worker's key .*fedhet flower worker --socket"):
        node_app.forward("query", RecordDict(), _context(str(sock)))


class Crafted:
    """What an attacker would send: unpickling it runs a shell command (here: it creates `marker`)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def test_an_authenticated_peer_cannot_make_the_worker_run_code(worker_socket: Path, tmp_path: Path) -> None:
    """The channel carries Flower's protobuf records, never pickles: a peer that holds the key and sends a
    crafted pickle (as the old channel's `conn.send((kind, content, context))` did), or crafted bytes in place
    of the records, gets an error reply; nothing runs, and the worker goes on serving."""
    from multiprocessing.connection import Client

    from fedhet.runtimes.flower.worker_key import read_key
    from fedhet.runtimes.flower.worker_wire import pack, read_reply

    marker, evil = tmp_path / "pwned", Crafted(tmp_path / "pwned")
    crafted = [pickle.dumps(("query", evil, evil)), pack(b"query", pickle.dumps(evil), pickle.dumps(evil))]
    for payload in crafted:
        with Client(str(worker_socket), family="AF_UNIX", authkey=read_key(worker_socket)) as conn:
            conn.send_bytes(payload)
            reply = read_reply(conn.recv_bytes())
        assert isinstance(reply, str) and reply.startswith("malformed request: "), reply  # an error reply
    assert not marker.exists()
    assert _partition(node_app.forward("query", RecordDict(), _context(str(worker_socket)))) == 1
    pickle.loads(crafted[0])  # the payload is armed: the old channel's unpickling would have run it
    assert marker.exists()


def test_the_client_app_does_not_unpickle_the_workers_reply(tmp_path: Path) -> None:
    """A process posing as the worker (it has the key) that answers with a crafted pickle makes the ClientApp
    fail clearly, and nothing runs."""
    from multiprocessing.connection import Listener

    from fedhet.runtimes.flower.worker_key import write_key

    sock, marker = Path(tempfile.mkdtemp(prefix="fedhet-test-w-")) / "node.sock", tmp_path / "pwned"

    def fake_worker(listener: Listener) -> None:
        with listener.accept() as conn:
            conn.recv_bytes()
            conn.send(("ok", Crafted(marker), Crafted(marker)))

    with Listener(str(sock), family="AF_UNIX", authkey=write_key(sock)) as listener:
        thread = threading.Thread(target=fake_worker, args=(listener,), daemon=True)
        thread.start()
        with pytest.raises(RuntimeError, match="the fedhet worker at .* sent a malformed reply"):
            node_app.forward("query", RecordDict(), _context(str(sock)))
        thread.join(10)
    assert not marker.exists()


def test_a_crafted_client_state_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    """Client states come back from Flower's context.state or the run's state folder as torch.save bytes: they
    load with the safe loader (fedhet.engine.safe_load), so a crafted one is refused before anything runs."""
    from fedhet.algorithms.ditto_mmd import DittoMMDState
    from fedhet.algorithms.ditto_mmd_penalty import MMDDKernelState, PenaltyState
    from fedhet.engine.safe_load import UntrustedFileError
    from fedhet.runtimes.flower.records import state_from_bytes, state_to_bytes

    kernel = MMDDKernelState(params={"w": torch.ones(2)}, optim={"state": {0: {"step": torch.tensor(3.0)}}})
    state = DittoMMDState(personal={"w": torch.arange(3.0)}, penalty=PenaltyState(mmdd={"l1": kernel}, steps=4))
    back = state_from_bytes(state_to_bytes(state))
    assert isinstance(back.penalty.mmdd["l1"], MMDDKernelState) and back.penalty.steps == 4
    assert torch.equal(back.penalty.mmdd["l1"].optim["state"][0]["step"], torch.tensor(3.0))

    marker = tmp_path / "pwned"
    state.local["evil"] = Crafted(marker)
    with pytest.raises(UntrustedFileError, match="a client state .*holds objects other than tensors, numbers and "
                                                 "fedhet states .*posix.system.*was not loaded"):
        state_from_bytes(state_to_bytes(state))
    assert not marker.exists()


def test_stored_bytes_that_are_not_a_client_state_are_refused() -> None:
    """What the loader gives back is checked to be a client state (its type is then known), not passed on."""
    import io

    from fedhet.errors import FedhetError
    from fedhet.runtimes.flower.records import state_from_bytes

    buf = io.BytesIO()
    torch.save({"local": {"w": torch.ones(2)}}, buf)  # tensors only: the safe loader accepts it
    with pytest.raises(FedhetError, match="holds a dict, not a client state"):
        state_from_bytes(buf.getvalue())


def test_an_idle_unauthenticated_peer_does_not_block_the_client_app(worker_socket: Path) -> None:
    """A local process that connects and says nothing is cut off after the handshake timeout, and the
    ClientApp is served meanwhile; the socket is the worker user's alone."""
    import socket
    import stat
    import time

    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(str(worker_socket))  # never answers the challenge
    try:
        start = time.monotonic()
        assert _partition(node_app.forward("query", RecordDict(), _context(str(worker_socket)))) == 1
        assert time.monotonic() - start < Worker.HANDSHAKE_SECONDS
        idle.settimeout(Worker.HANDSHAKE_SECONDS + 10)
        idle.recv(1024)  # the challenge
        assert idle.recv(1024) == b""  # then hung up on, after the timeout
    finally:
        idle.close()
    assert stat.S_IMODE(worker_socket.stat().st_mode) == 0o700
