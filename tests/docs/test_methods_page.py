"""docs/methods.md has one row per registered method (issue 39, item 5: the page had lost ditto_mmd and fedbip)."""

from __future__ import annotations

import re
from pathlib import Path

from fedhet.algorithms import ALGORITHMS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def test_every_registered_method_has_a_row_and_every_row_is_registered() -> None:
    rows = set(re.findall(r"^\| `([a-z0-9_]+)` \|", PAGE.read_text(), flags=re.MULTILINE))
    registered = set(ALGORITHMS.names())
    assert registered - rows == set(), f"registered methods without a row in docs/methods.md: {registered - rows}"
    assert rows - registered == set(), f"rows in docs/methods.md that name no registered method: {rows - registered}"
