"""Plugins: a config's `imports` (a .py file or a module name) registers a dataset that `fedhet run` then uses."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.config import load_config
from fedhet.data import dataset_info
from fedhet.errors import ConfigError

PLUGIN = textwrap.dedent('''
    """A user's dataset: two hospitals of random features, registered at import time."""
    import torch

    from fedhet.data import DatasetSpec, DomainData, register_dataset

    CALLS = []


    def load(ctx, domain):
        g = torch.Generator().manual_seed(len(domain))
        x = torch.randn(40, 5, generator=g)
        return DomainData(x, (x[:, 0] > 0).long(), note=f"generated {domain}")


    CALLS.append(1)
    register_dataset(DatasetSpec(
        name="{name}", domains=("north", "south"), classes=("no", "yes"), modality="features", loader=load,
        source="generated in a test", layout="(none)", feature_norm="impute_standardize", feature_dim=5,
        builtin=True))
''')


def write_config(path: Path, imports: list[str], dataset: str, out: Path) -> Path:
    path.write_text(textwrap.dedent(f"""
        imports: {json.dumps(imports)}
        method: fedavg
        rounds: 1
        data: {{dataset: {dataset}, augment: false}}
        model: {{name: mlp, args: {{hidden: [8]}}}}
        run: {{out_dir: {out}, num_threads: 1, quiet: true}}
        """))
    return path


def test_fedhet_run_imports_a_py_file_that_registers_a_dataset(tmp_path: Path, capsys) -> None:
    plugin = tmp_path / "my_datasets.py"
    plugin.write_text(PLUGIN.replace("{name}", "plugin_hospitals"))
    config = write_config(tmp_path / "c.yaml", [str(plugin)], "plugin_hospitals", tmp_path / "runs")
    assert main(["run", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out  # run.quiet: true: a summary of the clients, not a row each
    assert "2 clients: accuracy mean" in printed and "\nnorth " not in printed and "\navg " in printed
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["final"]) >= {"north", "south", "avg"}
    cfg = load_config(config)  # loading the config again does not run the file again (no "registered twice")
    module = next(m for name, m in sys.modules.items() if name.startswith("fedhet_plugin_my_datasets"))
    assert module.CALLS == [1] and cfg.data.dataset == "plugin_hospitals"
    assert dataset_info("plugin_hospitals").domains == ("north", "south")


def test_a_module_name_is_imported_from_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "my_plugin_pkg").mkdir()
    (tmp_path / "my_plugin_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_plugin_pkg" / "tables.py").write_text(PLUGIN.replace("{name}", "plugin_by_name"))
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["imports=[my_plugin_pkg.tables]", "data.dataset=plugin_by_name"])
    assert cfg.imports == ["my_plugin_pkg.tables"] and dataset_info("plugin_by_name").classes == ("no", "yes")


def test_a_relative_py_path_is_looked_up_beside_the_config_that_wrote_it(tmp_path: Path, monkeypatch) -> None:
    base, table, elsewhere = tmp_path / "base", tmp_path / "tables", tmp_path / "elsewhere"
    for folder in (base, table, elsewhere):
        folder.mkdir()
    (base / "my_datasets.py").write_text(PLUGIN.replace("{name}", "plugin_beside_base"))
    (elsewhere / "my_datasets.py").write_text(PLUGIN.replace("{name}", "plugin_in_cwd_decoy"))
    write_config(base / "base.yaml", ["./my_datasets.py"], "plugin_beside_base", tmp_path / "runs")
    (table / "t.yaml").write_text("extends: ../base/base.yaml\nseed: 1\n")
    monkeypatch.chdir(elsewhere)  # the working directory's file of the same name is not the one meant
    cfg = load_config(table / "t.yaml")
    assert cfg.imports == [str((base / "my_datasets.py").resolve())] and cfg.seed == 1
    assert dataset_info("plugin_beside_base").domains == ("north", "south")


def test_a_relative_py_path_not_beside_the_config_falls_back_to_the_current_directory(
        tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "cwd_datasets.py").write_text(PLUGIN.replace("{name}", "plugin_from_cwd"))
    config = write_config(tmp_path / "configs" / "c.yaml", ["cwd_datasets.py"], "plugin_from_cwd", tmp_path / "r")
    monkeypatch.chdir(tmp_path)
    assert load_config(config).imports == ["cwd_datasets.py"]
    assert dataset_info("plugin_from_cwd").classes == ("no", "yes")


def test_without_imports_the_dataset_is_unknown(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", [], "never_registered_plugin", tmp_path / "runs")
    assert main(["run", str(config)]) == 2


@pytest.mark.parametrize("entry, body, message", [
    ("./nowhere/x.py", None, r"imports: file '.*nowhere/x.py' not found \(a relative path is looked up in the "
                             r"folder of the config file that lists it, then in the current directory"),
    ("no_such_plugin_module", None, "imports: no module named 'no_such_plugin_module'"),
    ("my-plugin", None, "neither a module name .* nor a .py file"),
    ("broken.py", "x = 1\n1 / 0\n", r"importing 'broken.py' failed with ZeroDivisionError: division by zero "
                                    r"\(at .*broken.py:2\)"),
    ("dup.py", "from fedhet.data import register_dataset, dataset_info\n"
               "from fedhet.data.registry import get_spec\nregister_dataset(get_spec('heart_disease'))\n",
     "failed with ValueError: dataset 'heart_disease' registered twice"),
])
def test_import_errors_are_one_clear_line(tmp_path: Path, monkeypatch, entry: str, body: str | None,
                                          message: str) -> None:
    monkeypatch.chdir(tmp_path)
    if body is not None:
        (tmp_path / entry).write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"imports=[{entry}]"])
    assert main(["run", f"imports=[{entry}]"]) == 2
