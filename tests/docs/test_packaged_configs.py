"""The example configs ship with the package: the wheel holds every file of configs/ under fedhet/configs/, and
`fedhet run quickstart` / `configs/quickstart.yaml` find the packaged copy from any folder (saying so);
`fedhet configs [--copy DIR]` lists and copies them."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.config import load_config
from fedhet.config.examples import EXAMPLES_DIR, example_path, find_config, list_examples

ROOT = Path(__file__).resolve().parents[2]
REPO_CONFIGS = sorted(p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml"))


def test_the_package_folder_is_the_repositorys_configs() -> None:
    assert list_examples() == REPO_CONFIGS and "quickstart.yaml" in REPO_CONFIGS
    assert (EXAMPLES_DIR / "quickstart.yaml").read_bytes() == (ROOT / "configs" / "quickstart.yaml").read_bytes()


@pytest.mark.parametrize("name", ["quickstart", "quickstart.yaml", "configs/quickstart.yaml", "cpu/digits",
                                  "configs/cpu/digits.yaml"])
def test_a_missing_path_finds_the_packaged_example_and_says_so(name: str, tmp_path: Path, monkeypatch,
                                                               caplog) -> None:
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fedhet.config.examples"):
        found = find_config(name)
    assert found.is_file() and found.parent.parent in (EXAMPLES_DIR, EXAMPLES_DIR.parent)
    assert "using the example shipped with fedhet" in caplog.text and str(found) in caplog.text


def test_a_local_file_wins_and_unknown_names_stay_errors(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("name: mine\nrounds: 1\n")
    with caplog.at_level(logging.WARNING):
        assert load_config("configs/quickstart.yaml").name == "mine"
    assert not caplog.text
    assert example_path("/abs/quickstart.yaml") is None and example_path("../configs/quickstart.yaml") is None
    assert main(["run", "no_such_example", "--quiet"]) == 2


def test_fedhet_run_from_another_folder_uses_the_packaged_quickstart(tmp_path: Path, monkeypatch, caplog) -> None:
    """`fedhet run configs/quickstart.yaml` where the folder has no configs/: the packaged copy runs, and is named."""
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fedhet.config.examples"):
        assert main(["run", "configs/quickstart.yaml", "rounds=1", "train.local_steps=1", "data.max_test_per_client=8",
                     "--run-dir", "out", "--quiet"]) == 0
    assert f"using the example shipped with fedhet: {EXAMPLES_DIR / 'quickstart.yaml'}" in caplog.text
    assert (tmp_path / "out" / "summary.json").is_file()


def test_report_reference_tables_are_found_too(tmp_path: Path, monkeypatch) -> None:
    from fedhet.cli_commands import _load_reference

    monkeypatch.chdir(tmp_path)
    assert _load_reference("configs/paper/fraug_table2_digits.yaml")


def test_fedhet_configs_lists_and_copies(tmp_path: Path, capsys) -> None:
    assert main(["configs"]) == 0
    listed = [line.strip() for line in capsys.readouterr().out.splitlines()[1:]]
    assert listed == REPO_CONFIGS
    assert main(["configs", "--copy", str(tmp_path / "mine")]) == 0
    assert sorted(p.relative_to(tmp_path / "mine").as_posix() for p in (tmp_path / "mine").rglob("*.yaml")) == \
        REPO_CONFIGS
    assert main(["configs", "--copy", str(tmp_path / "mine")]) == 2  # nothing overwritten
    assert "already holds" in capsys.readouterr().err


def test_the_wheel_holds_every_example_config(tmp_path: Path) -> None:
    """Build the wheel offline (no build isolation: the venv's setuptools) from a copy of the tree (the build
    writes build/ and *.egg-info beside the sources) and compare its configs with configs/."""
    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "README.md"):
        tree.mkdir(exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "configs", tree / "configs")
    shutil.copytree(ROOT / "src", tree / "src", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))  # src/fedhet/configs stays a link
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.skip(f"cannot build a wheel here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    wheel = next(tmp_path.glob("fedhet-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        shipped = sorted(n.removeprefix("fedhet/configs/") for n in names if n.startswith("fedhet/configs/"))
        assert zf.read("fedhet/configs/quickstart.yaml") == (ROOT / "configs" / "quickstart.yaml").read_bytes()
    assert shipped == REPO_CONFIGS
    assert "fedhet/config/examples.py" in names
