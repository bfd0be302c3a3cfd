"""The key of the channel between a SuperNode's ClientApp and its fedhet worker (stdlib only: the lean
ClientApp imports it without torch)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_BYTES = 32


def key_path(socket: str | Path) -> Path:
    """Where the worker of `socket` keeps the channel's key."""
    return Path(f"{socket}.key")


def write_key(socket: str | Path) -> bytes:
    """A fresh random key for the channel, written to `key_path(socket)` with mode 0600 (replacing an old one)."""
    key, path = secrets.token_bytes(KEY_BYTES), key_path(socket)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    os.replace(tmp, path)
    return key


def read_key(socket: str | Path) -> bytes:
    """The channel's key, or a clear error when the worker has not written one (not running, or not yours)."""
    path = key_path(socket)
    try:
        return path.read_bytes()
    except OSError as err:
        raise RuntimeError(f"cannot read the fedhet worker's key {path} ({err.strerror}): start `fedhet flower "
                           f"worker --socket {socket}` as the user that runs this SuperNode") from err
