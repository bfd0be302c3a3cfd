"""docs/methods.md agrees with the registry (issue 39 item 5: the page had lost ditto_mmd and fedbip, and kept a
Ditto signature that no longer existed).

Per registered method the page has one row `| `name` | paper | shares | local / personal | `method_args` |`, and
- every back-quoted name in its `method_args` cell is a field of the method's `Params` dataclass (or of a
  dataclass-valued field, e.g. AdaptFED's `update`), or a `prefix_*` matching fields, or a docs path;
- `` `field` (x ...) `` states the field's default first: x parses to it (`none` for None, `[a, b]` for a list);
- the cell names every field, unless it says it abbreviates (`...`, `see ...`, or another method's: `FedBiP's`);
- the years the paper cell cites appear in the method module's docstring (where the paper is cited);
and every back-quoted call `name(arg, ...)` on the page or in docs/design.md that names a hook of `Algorithm` or of
a registered method lists that hook's arguments (a renamed or removed hook fails here).
"""

from __future__ import annotations

import builtins
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from fedhet.algorithms import ALGORITHMS
from fedhet.algorithms.base import Algorithm

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "methods.md"
ROW = re.compile(r"^\| `([a-z0-9_]+)` \|(.*)\|[ \t]*$", re.M)
NAME = re.compile(r"`([A-Za-z_][\w*]*)`")
DEFAULT = re.compile(r"`([a-z_]\w*)` \(([^()]*)\)")
ABBREVIATED = re.compile(r"\.\.\.|\bsee\b|\w's\b")
YEAR = re.compile(r"\b(?:19|20)\d\d\b")
CALL = re.compile(r"`([a-z_]\w*)\(([^()`]*)\)`")


def rows(text: str) -> dict[str, list[str]]:
    """Method name -> its cells after the name (paper, shares, local / personal, method_args)."""
    return {m.group(1): [c.strip() for c in m.group(2).split(" | ")] for m in ROW.finditer(text)}


def fields(params: type) -> dict[str, Any]:
    """A Params dataclass's field names -> defaults (a default_factory called; dataclasses.MISSING: required)."""
    if not dataclasses.is_dataclass(params):
        return {}
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(params)}


def literal(text: str) -> object:
    """The value a doc writes: 0.01, 1e-3, true, none, [head], or a bare word."""
    text = text.strip()
    lowered = text.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if text.startswith("[") and text.endswith("]"):
        return [literal(t) for t in text[1:-1].split(",") if t.strip()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def stated_default(text: str) -> object:
    """The default that `(x; ...)`, `(x / y)`, `(x, y: ...)` or `(x: why)` states: its first item."""
    return literal(re.split(r"\s*[;:,/]\s*|\s+", text.strip(), maxsplit=1)[0])


def args_problems(method: str, cell: str, params: type) -> list[str]:
    """What the `method_args` cell of `method`'s row gets wrong about `params`."""
    own = fields(params)
    nested = {k: v for value in own.values() if dataclasses.is_dataclass(value) for k, v in fields(type(value)).items()}
    problems = []
    for name in NAME.findall(cell):
        if name.endswith("*"):
            if not any(f.startswith(name[:-1]) for f in own):
                problems.append(f"{method}: `{name}` matches no field of {params.__name__}")
        elif name not in own and name not in nested and "/" not in name and not name.endswith(".md"):
            problems.append(f"{method}: `{name}` is not a field of {params.__name__} (fields: {sorted(own)})")
    for name, text in DEFAULT.findall(cell):
        if name in own and not dataclasses.is_dataclass(own[name]) and stated_default(text) != own[name]:
            problems.append(f"{method}: `{name}` ({text}) states the default {stated_default(text)!r}, "
                            f"{params.__name__} has {own[name]!r}")
    named = set(NAME.findall(cell))
    unnamed = [f for f in own if f not in named and not any(n.endswith("*") and f.startswith(n[:-1]) for n in named)]
    if unnamed and not ABBREVIATED.search(cell):
        problems.append(f"{method}: the row does not name {unnamed}; name them or abbreviate with `...`")
    if not own and cell != "—" and "see" not in cell:
        problems.append(f"{method}: {params.__name__} has no fields; its `method_args` cell should be —")
    return problems


def test_every_registered_method_has_a_row_and_every_row_is_registered() -> None:
    found = set(rows(PAGE.read_text()))
    registered = set(ALGORITHMS.names())
    assert registered - found == set(), f"registered methods without a row in docs/methods.md: {registered - found}"
    assert found - registered == set(), f"rows in docs/methods.md that name no registered method: {found - registered}"


def test_each_rows_method_args_are_the_params_fields_with_their_defaults() -> None:
    problems = []
    for method, cells in rows(PAGE.read_text()).items():
        if method in ALGORITHMS:
            assert len(cells) == 4, f"{method}: the row has {len(cells) + 1} cells, the table 5"
            problems += args_problems(method, cells[3], ALGORITHMS.get(method).Params)
    assert not problems, "docs/methods.md:\n" + "\n".join(problems)


def test_each_rows_paper_years_are_cited_in_the_methods_module() -> None:
    problems = []
    for method, cells in rows(PAGE.read_text()).items():
        if method in ALGORITHMS:
            doc = sys.modules[ALGORITHMS.get(method).__module__].__doc__ or ""
            missing = sorted(set(YEAR.findall(cells[0])) - set(YEAR.findall(doc)))
            if missing:
                problems.append(f"{method}: the row cites {missing}, its module's docstring does not")
    assert not problems, "docs/methods.md:\n" + "\n".join(problems)


def hooks() -> dict[str, list[inspect.Signature]]:
    """Hook name -> its signatures on Algorithm and every registered method class."""
    found: dict[str, list[inspect.Signature]] = {}
    for cls in (Algorithm, *(ALGORITHMS.get(n) for n in ALGORITHMS.names())):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                found.setdefault(name, []).append(inspect.signature(member))
    return found


def call_problems(page: Path, known: dict[str, list[inspect.Signature]]) -> list[str]:
    """`name(args)` on `page` naming a hook with other arguments, or (design.md) naming no hook at all."""
    problems = []
    for name, args in CALL.findall(page.read_text()):
        written = [a.split("=")[0].strip() for a in args.split(",") if a.strip()]
        if name in known:
            real = [[p for p in s.parameters if p != "self"] for s in known[name]]
            if written not in real:
                problems.append(f"{page.name}: `{name}({args})`: the hook takes {real[0]}")
        elif page.name == "design.md" and not hasattr(builtins, name):
            problems.append(f"{page.name}: `{name}({args})` names no hook of Algorithm or a registered method")
    return problems


def test_hook_signatures_on_the_pages_are_the_codes() -> None:
    known = hooks()
    assert {"broadcast", "aggregate", "personal_loss"} <= set(known)
    problems = call_problems(PAGE, known) + call_problems(DOCS / "design.md", known)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("cell", "problem"), [
    ("`lam` (0.1), `personal_epochs`, `schedule` (global_then_personal / tandem)", None),
    ("`lam` (0.2), `personal_epochs`, `schedule`", "states the default 0.2"),
    ("`lam`, `schedule`", "does not name ['personal_epochs']"),
    ("`lam`, `schedule`, ...", None),
    ("`lam`, `personal_epochs`, `schedule`, `mu`", "`mu` is not a field"),
    ("`lam`, `personal_*`, `schedule` (tandem)", "states the default 'tandem'"),
])
def test_the_row_check_catches_stale_rows(cell: str, problem: str | None) -> None:
    found = args_problems("ditto", cell, ALGORITHMS.get("ditto").Params)
    assert (found == []) if problem is None else any(problem in p for p in found), found
