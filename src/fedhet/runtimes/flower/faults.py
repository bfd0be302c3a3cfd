"""What the Flower runtime does when clients fail: the files it writes, the minimum it needs, short reasons."""

from __future__ import annotations

import math
import re

from fedhet.engine.executor import ClientsFailed

FAULTS_FILE = "faults.jsonl"
STOPPED_FILE = "stopped.json"


class RoundFailed(ClientsFailed):
    """Too few clients answered a round validly; the run stopped after a checkpoint."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (\S.*)$")
_WRAPPERS = ("ClientAppException", "RayTaskError")


_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>$", re.DOTALL)


def short_reason(reason: str | None, limit: int = 500) -> str:
    """An error reply's reason in one line: the root exception of a traceback (Ray wraps a ClientApp's
    exception in two more), without terminal colour codes."""
    text = _ANSI.sub("", reason or "no reason given").strip()
    flower = _FLOWER_REASON.match(text)
    if flower and "\n" not in flower.group(2):  # Flower's "<class 'X'>:<'message'>"
        text = f"{flower.group(1)}: {flower.group(2)}"
    if "\n" not in text and len(text) <= limit:
        return text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = [m for m in map(_EXCEPTION_LINE.match, lines) if m and not any(w in m.group(1) for w in _WRAPPERS)]
    line = f"{found[0].group(1).rsplit('.', 1)[-1]}: {found[0].group(2)}" if found else lines[-1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def required(fraction: float, total: int) -> int:
    """How many of `total` replies a round needs (at least one)."""
    return min(total, max(1, math.ceil(fraction * total - 1e-9)))
