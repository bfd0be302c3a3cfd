"""The long-lived fedhet worker beside a SuperNode (`fedhet flower worker --socket PATH`).

It answers the messages that `fedhet.runtimes.flower.node_app` forwards over a Unix domain socket, one at a time
(each peer handshakes in its own thread), with the same handlers as the full ClientApp
(`fedhet.runtimes.flower.client`), so results are those of the in-process runtime. torch, torchvision and fedhet
are imported once, and the experiment (data partition, model, algorithm) is built once per run config and kept
(`client.experiment_for`), instead of once per message. The client's state still lives in Flower's
`context.state` and the run's state folder, not here:
a restarted worker, or a node without one, continues exactly where the run is.

Request: (kind, content, context) with kind one of `client.HANDLERS`; reply: ("ok", content, context.state)
or ("error", "<type>: <message>"). Both travel as Flower's protobuf records (worker_wire.py), never as pickles:
nothing a peer sends can run code here. The channel is also authenticated: the worker writes a fresh random key
to `<socket>.key` (mode 0600, readable only by the user running it) and accepts a connection only after the HMAC
challenge of `multiprocessing.connection` with that key succeeds (worker_key.py). A failed or malformed message
is logged here and raised by the ClientApp, so Flower reports it to the ServerApp, whose fault handling decides
(docs/flower.md, "Faults").
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import traceback
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path

from flwr.app import Context, RecordDict

from fedhet.runtimes.flower import client
from fedhet.runtimes.flower.app import FlowerSettings
from fedhet.runtimes.flower.node_app import APP_DIR_KEY
from fedhet.runtimes.flower.worker_key import key_path, write_key
from fedhet.runtimes.flower.worker_wire import WireError, error_bytes, read_request, reply_bytes

log = logging.getLogger(__name__)


def answer(kind: str, content: RecordDict, context: Context) -> tuple[RecordDict, RecordDict] | str:
    """One request's reply content and updated `context.state`, or its error's one-line reason; never raises."""
    try:
        handler = client.HANDLERS.get(kind.split(".")[0])  # a message type with or without its action
        if handler is None:
            raise ValueError(f"unknown message kind {kind!r}")
        run_config = dict(context.run_config)
        app_dir = run_config.pop(APP_DIR_KEY, None)  # the App folder, when it carries plug-ins (node_app.py)
        if isinstance(app_dir, str) and app_dir not in sys.path:
            sys.path.insert(0, app_dir)
        setup = FlowerSettings.from_run_config(run_config).client_setup()
        return handler(content, context, setup), context.state
    except Exception as err:  # noqa: BLE001 - reported to the ClientApp, which raises it in Flower
        log.error("worker: %s message failed:\n%s", kind, traceback.format_exc())
        return f"{type(err).__name__}: {err}"


def reply_to(data: bytes) -> bytes:
    """The reply message to one request message (worker_wire); a malformed request gets an error reply."""
    try:
        request = read_request(data)
    except WireError as err:
        log.warning("worker: refused a malformed request (%s)", err)
        return error_bytes(f"malformed request: {err}")
    result = answer(*request)
    return error_bytes(result) if isinstance(result, str) else reply_bytes(*result)


class Worker:
    """Serve requests on the Unix socket `path` until `stop()` (or the process ends). Each peer is served in its
    own thread: its HMAC handshake must finish within HANDSHAKE_SECONDS (an idle or slow unauthenticated
    connection cannot block the ClientApp's), and requests are answered one at a time (the handlers share the
    experiment). The socket is 0700 and its key 0600: only the worker's user may connect."""

    HANDSHAKE_SECONDS = 5.0

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stop = threading.Event()
        self._answering = threading.Lock()
        self._key = b""  # written by `serve`

    def serve(self, ready: threading.Event | None = None) -> None:
        if not self.path.parent.exists():  # a folder it creates is private; an existing one is left as it is
            self.path.parent.mkdir(parents=True, mode=0o700)
        self.path.unlink(missing_ok=True)
        self._key = write_key(self.path)
        old_umask = os.umask(0o077)  # the socket is created private, not chmod-ed after a window
        try:
            listener = Listener(str(self.path), family="AF_UNIX")  # the handshake runs per peer, in its thread
        finally:
            os.umask(old_umask)
        with listener:
            os.chmod(self.path, 0o700)
            log.info("fedhet worker listening on %s (pid %d)", self.path, os.getpid())
            if ready is not None:
                ready.set()
            while not self._stop.is_set():
                try:
                    conn = listener.accept()
                except OSError as err:
                    log.warning("worker: accept failed (%s)", err)
                    continue
                if self._stop.is_set():
                    conn.close()
                    break
                threading.Thread(target=self._serve_peer, args=(conn,), daemon=True).start()
        self.path.unlink(missing_ok=True)
        key_path(self.path).unlink(missing_ok=True)

    def _serve_peer(self, conn: Connection) -> None:
        """Authenticate one peer, then answer its request."""
        with conn:
            if not self._authenticate(conn):
                return
            try:
                request = conn.recv_bytes()
            except (EOFError, OSError):
                return
            with self._answering:
                reply = reply_to(request)
            try:
                conn.send_bytes(reply)
            except OSError as err:  # the ClientApp died meanwhile (e.g. its SuperNode was killed)
                log.warning("worker: could not send the reply (%s); the message is lost", err)

    def _authenticate(self, conn: Connection) -> bool:
        """The HMAC challenge both ways (as Listener(authkey=...) does), cut off after HANDSHAKE_SECONDS."""
        timer = threading.Timer(self.HANDSHAKE_SECONDS, _hang_up, (conn,))
        timer.start()
        try:
            deliver_challenge(conn, self._key)
            answer_challenge(conn, self._key)
            return True
        except (AuthenticationError, EOFError, OSError) as err:  # refused before anything is read as a request
            log.warning("worker: refused a connection that did not authenticate in time (%s)", err or "timeout")
            return False
        finally:
            timer.cancel()

    def stop(self) -> None:
        """Make `serve` return (it wakes the listener with one connection)."""
        self._stop.set()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                wake.connect(str(self.path))
        except OSError:
            pass


def _hang_up(conn: Connection) -> None:
    """End a peer's connection from another thread: shutdown wakes a read blocked on it (close would not)."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(conn.fileno())) as sock:
        sock.shutdown(socket.SHUT_RDWR)
