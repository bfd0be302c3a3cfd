"""Layers point one way: foundations <- core <- algorithms <- engine <- runtimes <- launch, tune, privacy <- cli.

Every `fedhet` import of every module (lazy ones inside functions too) must go to the same layer or a lower
one; above the foundations each layer is one package, so there is no package-level cycle. A method module
names no other layer than core, the foundations and `algorithms` itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fedhet"
FOUNDATIONS = {"errors", "registry", "outpaths", "atomic", "cache", "plugins", "yaml_input", "config", "data", "models",
               "losses", "report", "method_catalog", "dataset_catalog"}
LAYERS = {**{name: 0 for name in FOUNDATIONS}, "core": 1, "algorithms": 2, "engine": 3, "runtimes": 4,
          "launch": 5, "tune": 5, "privacy": 5, "cli": 6, "cli_args": 6, "cli_commands": 6, "cli_parser": 6,
          "config_doc": 6, "__init__": 6, "__main__": 6}


def unit_of(path: Path) -> str:
    """The top-level package or module of a file under src/fedhet."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def fedhet_imports(path: Path) -> set[str]:
    """The top-level fedhet units a file imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found |= {n.split(".")[1] for n in names if n.startswith("fedhet.") and n.count(".") >= 1}
    return found


FILES = sorted(SRC.rglob("*.py"))


def test_every_unit_has_a_layer() -> None:
    assert {unit_of(p) for p in FILES} <= set(LAYERS), "a new top-level module or package needs a layer here"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down(path: Path) -> None:
    unit = unit_of(path)
    upward = {u for u in fedhet_imports(path) if LAYERS.get(u, 99) > LAYERS[unit]}
    assert not upward, f"{path.relative_to(SRC)} (layer {unit}) imports {sorted(upward)} from a higher layer"
