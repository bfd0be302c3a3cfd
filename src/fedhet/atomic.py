"""Atomic file writes: write to a temporary file in the same folder, fsync, then rename over the target; and
the strict JSON every results file is written in.

The temporary file gets the mode a plain `open(path, "w")` would give (0o666 minus the umask), not mkstemp's
private 0o600, so results are readable by whoever the user's umask allows.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch


def current_umask() -> int:
    """The process umask (read by setting and restoring it: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and replaces `path`, on error removed,
    so readers see the old file or the new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~current_umask())
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call `write(tmp_path)` and move the result to `path` atomically."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace `path` with `data` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Replace `path` with UTF-8 `text` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def strict_json(obj: Any, indent: int | None = None) -> str:  # Any: any JSON-serialisable value
    """JSON any parser reads: NaN and +-inf, which `json.dumps` writes as bare `NaN` / `Infinity` (not JSON),
    become null; readers take a null metric as missing (fedhet.report reads it as NaN)."""
    return json.dumps(_finite(obj), indent=indent, allow_nan=False)


def _finite(obj: Any) -> Any:  # Any: a JSON value, mapped leaf by leaf
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> Path:  # Any: anything torch.save takes
    """torch.save, atomically."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return atomic_write_bytes(path, buf.getvalue())
