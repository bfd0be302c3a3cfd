"""Checks on output paths given on the command line (`report --out`, `sweep --report-dir`, `data show --plot`).

Each check runs before any work, so a bad path costs nothing and writes nothing; each failure is one FedhetError
naming the path, the problem and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedhet.errors import FedhetError

PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")


def _check_parents(path: Path, flag: str) -> None:
    """The nearest existing ancestor of `path` must be a folder we may write in."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise FedhetError(f"{flag} '{path}': '{parent}' is a file, not a folder; give a path inside a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise FedhetError(f"{flag} '{path}': cannot write in '{parent}' (permission denied); give a "
                                  "path in a folder you can write")
            return


def check_output_dir(path: Path, flag: str, holds: str = "report.md, report.csv and curves.png") -> Path:
    """`path` may be (or become) a folder that fedhet writes files into (`holds`: what, for the message)."""
    if path.exists():
        if not path.is_dir():
            raise FedhetError(f"{flag} '{path}' is an existing file, not a folder; give a folder (it will hold "
                              f"{holds})")
        if not os.access(path, os.W_OK | os.X_OK):
            raise FedhetError(f"{flag} '{path}': cannot write in it (permission denied); give a folder you can write")
        return path
    _check_parents(path, flag)
    return path


def check_plot_file(path: Path, flag: str = "--plot") -> Path:
    """`path` may be written as an image: a file name with an image extension, in a writable folder."""
    if path.is_dir():
        raise FedhetError(f"{flag} '{path}' is a folder; give a file name, e.g. {path / 'partition.png'}")
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        what = f"'.{fmt}' is not an image format" if fmt else "the name has no image extension"
        raise FedhetError(f"{flag} '{path}': {what}; end the file name with "
                          f"{', '.join('.' + f for f in PLOT_FORMATS[:-1])}")
    if path.exists() and not os.access(path, os.W_OK):
        raise FedhetError(f"{flag} '{path}': the file is not writable (permission denied); give another file name")
    _check_parents(path, flag)
    return path


def write_failed(path: Path, err: OSError, flag: str) -> FedhetError:
    """An OSError while writing output, as one line naming the path and the fix."""
    return FedhetError(f"cannot write {flag} '{path}': {err.strerror or err} ('{err.filename or path}'); "
                       "give a path in a folder you can write")
