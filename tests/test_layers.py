"""Layers point one way. Every `fedhet` import of every module (lazy ones inside functions and typing-only ones
too; `import fedhet.x`, `from fedhet.x import y`, `from fedhet import x`, relative imports and
`import_module("fedhet.x")` alike) must go to
a unit of a lower tier, or stay inside its own unit (a top-level module or package of src/fedhet), so there is
no cycle between units.

The foundation units sit at the lowest tier their imports allow (derived from the code):
    errors, atomic, cache, version, method_catalog   import nothing of fedhet (method_catalog reads source text)
    yaml_input, outpaths, losses, registry           errors
    plugins                                          registry (a plug-in meets the built-ins right after it loads)
    config                                           plugins (a config's `imports:`), yaml_input
    data, report                                     config, registry, outpaths, atomic
    models, dataset_catalog                          data (the LDM's image pool; the catalog renders the
                                                     registry), losses (descent steps), registry
Above them each tier is the usual stack: core (the contract: config; the model zoo for Work.model's type only)
< algorithms < engine < runtimes < launch, privacy < tune (its population runs on launch's executor choice)
< the CLI. The CLI modules keep their own order
(cli_args < cli_commands, config_doc < cli_parser < cli, and the package's `__init__`, which re-exports
`load_exported` from launch) instead of the lowest tiers their imports allow: cli_args imports only errors,
but it parses command lines and belongs with them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fedhet"
TIERS: list[tuple[str, ...]] = [
    ("errors", "atomic", "cache", "version", "method_catalog"),
    ("yaml_input", "outpaths", "losses", "registry"),
    ("plugins",),
    ("config",),
    ("data", "report"),
    ("models", "dataset_catalog"),
    ("core",),
    ("algorithms",),
    ("engine",),
    ("runtimes",),
    ("launch", "privacy"),
    ("tune",),
    ("cli_args",),
    ("cli_commands", "config_doc"),
    ("cli_parser",),
    ("cli", "__init__"),
]
TIER = {unit: k for k, units in enumerate(TIERS) for unit in units}
FILES = sorted(SRC.rglob("*.py"))


def unit_of(path: Path) -> str:
    """The top-level package or module of a file under src/fedhet (`__init__` for the package's own)."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def package_of(path: Path) -> list[str]:
    """The dotted package a file's relative imports start from, as parts (['fedhet', 'data'])."""
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return parts[:-1]


def imported_modules(path: Path) -> list[list[str]]:
    """Every module a file imports, as dotted parts; `from pkg import x` gives pkg.x (x may be a module), and
    `import_module("fedhet.x")` with a literal name counts too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package_of(path)[:len(package_of(path)) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            found += [module + [a.name] for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            found.append(str(node.args[0].value).split("."))  # importlib.import_module("fedhet.x")
    return found


def fedhet_imports(path: Path) -> set[str]:
    """The fedhet units a file imports: `fedhet.x...` is unit x; a name `fedhet/__init__.py` defines
    (`from fedhet import __version__`) is unit `__init__`."""
    units = set()
    for parts in imported_modules(path):
        if parts[0] == "fedhet":
            units.add(parts[1] if len(parts) > 1 and parts[1] in TIER else "__init__")
    return units


def test_every_unit_has_a_tier() -> None:
    missing = {unit_of(p) for p in FILES} - set(TIER)
    assert not missing, f"{sorted(missing)}: a new top-level module or package needs a tier in TIERS"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down(path: Path) -> None:
    unit = unit_of(path)
    upward = {u for u in fedhet_imports(path) - {unit} if TIER[u] >= TIER[unit]}
    assert not upward, f"{path.relative_to(SRC)} (unit {unit}, tier {TIER[unit]}) imports {sorted(upward)}, " \
                       "which are not in a lower tier"
