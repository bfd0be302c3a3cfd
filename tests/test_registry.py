"""One discovery mechanism for methods, models and datasets: a `Registry` names the package whose modules
register its built-ins, and `fedhet.plugins` imports them (every module, sub-packages aside) on the first
registration or look-up; importing the package itself loads none of them."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent("""
    import json, sys
    import fedhet.core.contract
    contract = sorted(m for m in sys.modules if m.startswith("fedhet"))
    import fedhet.models
    networks = [m for m in sys.modules if m.startswith("fedhet.models.") and m != "fedhet.models.base"]
    print(json.dumps({"contract": contract, "networks": networks}))
""")


def zoo(root: Path, name: str) -> None:
    """A package `name` whose modules register animals into its registry; a sub-package that must not load."""
    (root / name / "inner").mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"from fedhet.registry import Registry\nZOO = Registry('a', '{name}')\n")
    for animal in ("cat", "dog"):
        (root / name / f"{animal}.py").write_text(f"from {name} import ZOO\nZOO.register('{animal}')('{animal}')\n")
    (root / name / "inner" / "__init__.py").write_text(f"from {name} import ZOO\nZOO.register('never')('never')\n")


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("zoo_")]:
        del sys.modules[name]


@pytest.mark.parametrize("look_up", ["get", "names", "contains"])
def test_the_built_ins_load_on_the_first_look_up_and_not_before(packages: Path, look_up: str) -> None:
    zoo(packages, f"zoo_{look_up}")
    registry = importlib.import_module(f"zoo_{look_up}").ZOO
    assert f"zoo_{look_up}.cat" not in sys.modules
    found = {"get": lambda: registry.get("dog") == "dog", "names": lambda: registry.names() == ["cat", "dog"],
             "contains": lambda: "cat" in registry}[look_up]
    assert found() and registry.names() == ["cat", "dog"]
    assert f"zoo_{look_up}.inner" not in sys.modules


def test_a_plug_in_taking_a_built_in_name_fails_when_it_registers(packages: Path) -> None:
    zoo(packages, "zoo_clash")
    registry = importlib.import_module("zoo_clash").ZOO
    with pytest.raises(ValueError, match="a 'cat' registered twice"):
        registry.register("cat")("a plug-in's cat")  # before any look-up: the built-ins come first
    assert registry.get("cat") == "cat"


def test_the_contract_loads_neither_data_nor_models_and_no_network_loads_before_a_look_up() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    facts = json.loads(done.stdout)
    heavy = [m for m in facts["contract"] if m.startswith(("fedhet.data", "fedhet.models"))]
    assert not heavy and len(facts["contract"]) <= 16, facts["contract"]
    assert set(facts["networks"]) <= {"fedhet.models.complexity", "fedhet.models.param_partition"}, facts["networks"]
