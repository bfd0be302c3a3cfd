"""One discovery mechanism for methods, models and datasets: a `Registry` names the package whose modules
register its built-ins and imports them (every module, sub-packages aside) on the first look-up; importing the
package loads none of them; a user's plug-ins (`imports:`, `fedhet.plugins`) meet the built-ins right after they
register, so one that takes a built-in's name fails naming itself."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhet import registry as registry_module
from fedhet.errors import ConfigError
from fedhet.plugins import import_plugins

PROBE = textwrap.dedent("""
    import json, sys
    import fedhet.core.contract
    contract = sorted(m for m in sys.modules if m.startswith("fedhet"))
    import fedhet.models
    networks = [m for m in sys.modules if m.startswith("fedhet.models.") and m != "fedhet.models.base"]
    from fedhet.engine.safe_load import safe_types
    states = [t.__name__ for t in safe_types()]
    print(json.dumps({"contract": contract, "networks": networks, "states": states}))
""")


def zoo(root: Path, name: str, init: str = "") -> None:
    """A package `name` whose modules register animals into its registry (`init` ends its __init__); a
    sub-package that must not load."""
    (root / name / "inner").mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"from fedhet.registry import Registry\nZOO = Registry('a', '{name}')\n"
                                             + init)
    for animal in ("cat", "dog"):
        (root / name / f"{animal}.py").write_text(f"from {name} import ZOO\nZOO.register('{animal}')('{animal}')\n")
    (root / name / "inner" / "__init__.py").write_text(f"from {name} import ZOO\nZOO.register('never')('never')\n")


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry_module, "_WITH_BUILTINS", [])  # only the zoo registries
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


def test_a_built_in_registering_while_the_package_imports_loads_no_other(packages: Path) -> None:
    zoo(packages, "zoo_init", init="from zoo_init import cat\n")  # as fedhet.data's protocols import heart_disease
    registry = importlib.import_module("zoo_init").ZOO
    assert "zoo_init.dog" not in sys.modules  # (`python -m` of a module of the package would warn otherwise)
    assert registry.names() == ["cat", "dog"]


def test_a_plug_in_meets_the_built_ins_right_after_it_registers(packages: Path) -> None:
    zoo(packages, "zoo_plug")
    registry = importlib.import_module("zoo_plug").ZOO
    (packages / "my_bird.py").write_text("from zoo_plug import ZOO\nZOO.register('bird')(1)\n")
    import_plugins(["my_bird.py"])
    assert "zoo_plug.cat" in sys.modules and registry.names() == ["bird", "cat", "dog"]


def test_a_plug_in_taking_a_built_in_name_fails_naming_the_plug_in(packages: Path) -> None:
    zoo(packages, "zoo_clash")
    (packages / "my_cat.py").write_text("from zoo_clash import ZOO\nZOO.register('cat')(2)\n")
    with pytest.raises(ConfigError, match="imports: importing 'my_cat.py' failed with ValueError: a 'cat' registered "
                                          "twice"):
        import_plugins(["my_cat.py"])  # the built-ins were not loaded yet: they come right after it


def test_the_contract_loads_neither_data_nor_models_no_network_loads_before_a_look_up_and_states_are_known() -> None:
    """In a fresh process: what importing loads, and the methods' state classes a checkpoint may hold are known to
    the safe loader before any method was looked up."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    facts = json.loads(done.stdout)
    heavy = [m for m in facts["contract"] if m.startswith(("fedhet.data", "fedhet.models"))]
    assert not heavy and len(facts["contract"]) <= 18, facts["contract"]  # 18: + config.privacy, config.attack
    assert set(facts["networks"]) <= {"fedhet.models.complexity", "fedhet.models.param_partition"}, facts["networks"]
    assert {"DittoState", "ScaffoldServerState", "MMDDKernelState"} <= set(facts["states"])
