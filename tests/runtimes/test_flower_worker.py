"""The lean deployment ClientApp (`node_app`) and the fedhet worker: errors reach the ClientApp clearly."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest

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


def test_worker_answers_and_reports_failures() -> None:
    sock = Path(tempfile.mkdtemp(prefix="fedhet-test-w-")) / "node.sock"
    worker, ready = Worker(sock), threading.Event()
    thread = threading.Thread(target=worker.serve, args=(ready,), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        context = _context(str(sock))
        reply = node_app.forward("query", RecordDict(), context)
        assert reply["fedhet"]["client"] == 1
        assert context.state["keep"]["x"] == 1  # the state made the round trip
        with pytest.raises(RuntimeError, match="failed on a bogus message: ValueError: unknown message kind"):
            node_app.forward("bogus", RecordDict(), context)
        with pytest.raises(RuntimeError, match="failed on a query message: .*partition-id 9"):
            node_app.forward("query", RecordDict(), _context(str(sock), partition=9))
        assert node_app.forward("query", RecordDict(), context)["fedhet"]["client"] == 1  # still serving
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


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
        assert node_app.forward("query", RecordDict(), _context(str(sock)))["fedhet"]["client"] == 1
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive() and not key_path(sock).exists()


def test_a_missing_worker_key_is_a_clear_error(tmp_path) -> None:
    sock = tmp_path / "node.sock"
    sock.touch()  # a socket path exists, but no key beside it (another user's worker, or a stale path)
    with pytest.raises(RuntimeError, match="cannot read the fedhet worker's key .*fedhet flower worker --socket"):
        node_app.forward("query", RecordDict(), _context(str(sock)))
