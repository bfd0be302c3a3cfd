"""The built-in methods as `fedhet methods` lists them, read from fedhet/algorithms/*.py with `ast`, so the
listing imports neither torch nor the methods (`fedhet methods` in well under 2 s of CPU; importing the
algorithms package costs 5-8 s, torchvision and torch._dynamo included).

Per registered class (`@register`): its `name`, the class flags `personalized`, `one_shot`, `centralized` and
`requires` (what a user installs or runs first), each inherited along the module-level class hierarchy the way
Python would, and the first paragraph of its module's docstring. tests/engine/test_cli.py checks that the
catalog agrees with the imported registry, so the two cannot drift.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

FLAGS = ("personalized", "one_shot", "centralized", "requires")
TUNERS = ("FedPop (FedPop-L + FedPop-G) inside RS or SHA, with RS, SHA and FedEx as baselines: `fedhet tune CONFIG` "
          "(docs/tune.md)")


@dataclass(frozen=True)
class MethodEntry:
    name: str
    summary: str
    personalized: bool = False
    one_shot: bool = False
    centralized: bool = False
    requires: str = ""


def _class_values(node: ast.ClassDef) -> dict[str, object]:
    """The literal class-level assignments of `node` (name = "x", personalized: ClassVar[bool] = True)."""
    values: dict[str, object] = {}
    for stmt in node.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else \
            stmt.target if isinstance(stmt, ast.AnnAssign) else None
        value = getattr(stmt, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return values


def _base_names(node: ast.ClassDef) -> list[str]:
    """`class A(B[S, W], C)` -> ['B', 'C']."""
    names = []
    for base in node.bases:
        base = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _summary(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def method_catalog(folder: Path | None = None) -> list[MethodEntry]:
    """Every `@register`ed method of the algorithms package, sorted by name."""
    folder = folder or Path(__file__).parent / "algorithms"
    classes: dict[str, tuple[ast.ClassDef, str]] = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (node, _summary(ast.get_docstring(tree)))

    def lookup(cls: str, key: str, seen: frozenset[str] = frozenset()) -> object:
        if cls not in classes or cls in seen:
            return None
        node, _ = classes[cls]
        own = _class_values(node)
        if key in own:
            return own[key]
        return next((v for b in _base_names(node) if (v := lookup(b, key, seen | {cls})) is not None), None)

    entries = []
    for cls, (node, summary) in classes.items():
        registered = any(isinstance(d, ast.Name) and d.id == "register" for d in node.decorator_list)
        name = lookup(cls, "name")
        if registered and isinstance(name, str):
            flags = {k: lookup(cls, k) for k in FLAGS}
            entries.append(MethodEntry(name, summary, bool(flags["personalized"]), bool(flags["one_shot"]),
                                       bool(flags["centralized"]), str(flags["requires"] or "")))
    return sorted(entries, key=lambda e: e.name)
