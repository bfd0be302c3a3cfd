"""Loading what fedhet wrote, without running code: checkpoints and client states are read with
`torch.load(weights_only=True)`, which rebuilds tensors, numbers, strings, lists, tuples, dicts and sets and
refuses everything else, plus the few types registered here: the state dataclasses of every method.

Those are found, at each load, by walking `ClientState.__subclasses__()` and `ServerState.__subclasses__()`
recursively (a method of your own, imported through a config's `imports`, is covered), together with the
dataclasses and enums their fields' annotations name (`DittoMMDState.penalty: PenaltyState`, and in turn its
`MMDDKernelState`s). A file holding any other object (a crafted pickle whose `__reduce__` calls `os.system`,
say) is refused with an `UntrustedFileError` before anything of it runs. A state that holds a type of your own
that no field annotation names can be allowed with `allow_types(MyType)` (docs/design.md, "Loading is safe").
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
import threading
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import torch

from fedhet.algorithms.registry import ALGORITHMS
from fedhet.core.contract import ClientState, ServerState
from fedhet.errors import CheckpointError

_EXTRA: set[type] = set()
_LOCK = threading.Lock()  # torch's safe_globals context edits a process-wide list


class UntrustedFileError(CheckpointError):
    """A checkpoint or client state holds an object that is not a tensor, number, container or fedhet state."""


def allow_types(*types: type) -> None:
    """Let `load_trusted` rebuild these classes too (call it where they are defined, e.g. in a plugin module).
    Only allow plain data classes: unpickling calls `cls.__new__` and `__setstate__` (or fills `__dict__`)."""
    _EXTRA.update(types)


def _subclasses(cls: type) -> Iterator[type]:
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        yield sub
        yield from _subclasses(sub)


def _named_types(hint: Any) -> Iterator[type]:  # Any: any annotation object (typing forms)
    """The dataclass and enum types an annotation names, at any depth (`dict[str, X] | None` gives X)."""
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or issubclass(hint, enum.Enum)):
        yield hint
    for arg in typing.get_args(hint):
        yield from _named_types(arg)


def _field_types(cls: type) -> Iterator[type]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve names no type to allow
        return
    for name in (f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ():
        yield from _named_types(hints.get(name))


def safe_types() -> list[type]:
    """Every class `load_trusted` rebuilds beyond torch's own: state classes, the types their fields name, and
    those given to `allow_types`."""
    ALGORITHMS.load()  # every built-in method's state classes exist before the walk
    todo = [ClientState, ServerState, *_subclasses(ClientState), *_subclasses(ServerState), *_EXTRA]
    seen: dict[type, None] = {}
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen[cls] = None
            todo.extend(_field_types(cls))
    return list(seen)


def _reason(err: Exception) -> str:
    """torch's one-line reason (e.g. 'Unsupported global: GLOBAL posix.system ...') out of its long message."""
    text = str(err)
    marker = "WeightsUnpickler error: "
    if marker in text:
        return text[text.index(marker) + len(marker):].splitlines()[0].split(". Please use")[0].strip()
    generic = ("Weights only load failed", "Check the documentation")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(generic)]
    return lines[0].rstrip(".") if lines else type(err).__name__


def load_trusted(source: str | Path | bytes | IO[bytes], what: str) -> Any:  # Any: what torch.load returns
    """The object saved with `torch.save` in `source` (a path, bytes or a binary file), on the CPU; an
    `UntrustedFileError` naming `what` when it holds an object of a type not allowed (see the module docstring):
    nothing of it is rebuilt, no code of it runs."""
    stream = io.BytesIO(source) if isinstance(source, bytes) else source
    allowed: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = list(safe_types())  # Any: torch's type
    try:
        with _LOCK, torch.serialization.safe_globals(allowed):
            return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "GLOBAL" not in str(err):  # not a refused type but damage ("Unsupported operand"): the caller's error,
            raise pickle.UnpicklingError(_reason(err)) from None  # with torch's one-line reason
        raise UntrustedFileError(
            f"{what} holds objects other than tensors, numbers and fedhet states ({_reason(err)}) and was not "
            "loaded: fedhet only reads back the types it writes. If you wrote it with a state type of your own, "
            "allow it with fedhet.engine.safe_load.allow_types; otherwise do not trust this file.") from None
