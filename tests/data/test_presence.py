"""`fedhet data list` says whether each dataset is on this machine; `data show --plot` titles name the partition."""

from __future__ import annotations

from pathlib import Path

from fedhet.cli import main
from fedhet.dataset_catalog import load_catalog, presence, render_catalog


def get_spec(name: str) -> dict[str, object]:
    return next(e for e in load_catalog() if e["name"] == name)


def test_the_shipped_catalog_is_the_registry() -> None:
    assert load_catalog() == render_catalog(), "regenerate it: python -m fedhet.dataset_catalog --write"


def test_present_missing_builtin_and_own(tmp_path: Path) -> None:
    (tmp_path / "pacs").mkdir()
    assert presence(get_spec("pacs"), tmp_path) == f"present: {tmp_path / 'pacs'}"
    assert presence(get_spec("officehome"), tmp_path) == f"missing under {tmp_path}"
    assert presence(get_spec("rxrx1"), None).startswith("missing: no data root")
    assert "generated without files: synth_digits" in presence(get_spec("digits"), tmp_path)
    assert presence(get_spec("offline_digits"), None) == "built in"
    assert presence(get_spec("csv"), tmp_path).startswith("your own data")


def test_data_list_prints_it(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "tiny_shakespeare").mkdir()
    monkeypatch.setenv("FEDHET_DATA", str(tmp_path))
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert f"data root: {tmp_path}" in out
    assert "dataset: shakespeare (text)" in out and f"on this machine: present: {tmp_path / 'tiny_shakespeare'}" in out


def test_partition_plot_title_names_its_parameters() -> None:
    from fedhet.config.sections import DataConfig
    from fedhet.data.show import partition_label

    label = partition_label(DataConfig(partition="dirichlet", num_clients=10, alpha=0.1, fraction=0.2), 3)
    assert label == "dirichlet (num_clients=10, alpha=0.1, fraction=0.2), seed 3"
    assert partition_label(DataConfig(partition="pathological", classes_per_client=3), 0) == \
        "pathological (num_clients=4, classes_per_client=3), seed 0"
