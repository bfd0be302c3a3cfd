"""Ctrl-C and SIGTERM as `KeyboardInterrupt`, held back while a round is being committed to disk.

A round's commit (round counter, state snapshot, checkpoint, metrics file) must happen as a whole or not at
all. `StopSignals` turns SIGINT and SIGTERM into `KeyboardInterrupt` (so the loop can roll back and write the
checkpoint of the last completed round), except inside `deferred()`: a signal that arrives there is recorded
and raised only when the block has finished, so the commit it interrupted is complete on disk first.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Install with `with StopSignals() as signals:`; use `with signals.deferred():` around a commit."""

    def __init__(self) -> None:
        self._deferring = 0
        self.pending: int | None = None  # the signal received while deferring, if any
        self._previous: dict[int, Any] = {}  # Any: signal.getsignal's result (typeshed's private _HANDLER)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._deferring:
            self.pending = signum
            return
        raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers can be set only there
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    @contextmanager
    def deferred(self, reraise: bool = True) -> Iterator[None]:
        """Hold Ctrl-C / SIGTERM until the block ends, then raise KeyboardInterrupt if one arrived (and
        `reraise`; the stop after an interrupt passes False: it is stopping already)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring and self.pending is not None:
            self.pending = None
            if reraise:
                raise KeyboardInterrupt
