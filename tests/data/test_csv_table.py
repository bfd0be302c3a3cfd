"""`csv` on generated tables: one file with a client column or a folder of per-client files, the label and
feature columns, one-hot categoricals, the missing-value policy, per-client standardisation, errors, and a
1-round run end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.config import DataConfig, load_config
from fedhet.data import DataFileError, build_federated_data
from fedhet.data.examples import write_example_csv
from fedhet.errors import ConfigError, DatasetNotFoundError

REPO = Path(__file__).resolve().parents[2]


def table(path: Path, rows: list[str], header: str = "site,age,bp,smoker,y") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def rows(site: str, n: int, offset: float = 0.0, smoker: str = "yes") -> list[str]:
    return [f"{site},{40 + i + offset},{120 + 2 * i},{smoker if i % 2 else 'no'},{i % 2}" for i in range(n)]


def cfg(root: Path, **options) -> DataConfig:
    return DataConfig(dataset="csv", root=str(root), augment=False, test_fraction=0.25,
                      options={"label": "y", **options})


def all_x(ds) -> torch.Tensor:
    return torch.stack([ds[i][0] for i in range(len(ds))])


def test_one_file_with_a_client_column(tmp_path: Path) -> None:
    path = table(tmp_path / "t.csv", rows("b", 8) + rows("a", 12, offset=100))
    fed = build_federated_data(cfg(path, client_column="site", categorical=["smoker"]), seed=0)
    assert [c.name for c in fed.clients] == ["a", "b"] and fed.classes == ["0", "1"]
    assert fed.input_shape == (4,) and fed.modality == "features"  # age, bp, smoker=no, smoker=yes
    assert [(len(c.train), len(c.test)) for c in fed.clients] == [(9, 3), (6, 2)]


def test_folder_of_files_one_client_each(tmp_path: Path) -> None:
    table(tmp_path / "d" / "north.csv", rows("x", 8))
    table(tmp_path / "d" / "south.csv", rows("x", 8), header="site,age,bp,smoker,y")
    (tmp_path / "d" / "README.md").write_text("not read")
    fed = build_federated_data(cfg(tmp_path / "d", features=["age", "bp"]), seed=0)
    assert [c.name for c in fed.clients] == ["north", "south"] and fed.input_shape == (2,)
    with pytest.raises(ConfigError, match="client_column applies to a single CSV file"):
        build_federated_data(cfg(tmp_path / "d", client_column="site"), seed=0)
    table(tmp_path / "d" / "west.csv", rows("x", 4), header="site,age,bp,smokes,y")
    with pytest.raises(DataFileError, match="west.csv' has other columns .*smoker, smokes"):
        build_federated_data(cfg(tmp_path / "d"), seed=0)


def test_standardised_on_each_clients_training_split(tmp_path: Path) -> None:
    path = table(tmp_path / "t.csv", rows("a", 12) + rows("b", 12, offset=1000))
    fed = build_federated_data(cfg(path, client_column="site", categorical=["smoker"]), seed=0)
    for client in fed.clients:
        x = all_x(client.train)
        assert torch.allclose(x.mean(0), torch.zeros(4), atol=1e-4)  # b's offset of 1000 is gone: its own stats
        assert torch.allclose(x[:, :2].std(0, unbiased=False), torch.ones(2), atol=1e-4)


def test_label_order_and_string_labels(tmp_path: Path) -> None:
    path = table(tmp_path / "t.csv", [f"a,{i},1,no,{v}" for i, v in enumerate(["10", "9", "10", "2", "9", "2"])])
    fed = build_federated_data(cfg(path, client_column="site", features=["age", "bp"]), seed=0)
    assert fed.classes == ["2", "9", "10"]  # numeric order
    path = table(tmp_path / "s.csv", [f"a,{i},1,no,{v}" for i, v in enumerate(["sick", "well"] * 4)])
    fed = build_federated_data(cfg(path, client_column="site", features=["age", "bp"]), seed=0)
    assert fed.classes == ["sick", "well"]


def test_non_numeric_column_is_an_error_naming_it(tmp_path: Path) -> None:
    path = table(tmp_path / "t.csv", rows("a", 6))
    with pytest.raises(DataFileError, match=r"column 'smoker' holds the non-numeric value 'no' at .*t.csv line 2; "
                                            r"list it in data.options.categorical"):
        build_federated_data(cfg(path, client_column="site"), seed=0)


def test_missing_values_error_or_impute(tmp_path: Path) -> None:
    data = rows("a", 8)
    data[2] = "a,,124,no,0"
    data[5] = "a,45,125,NA,1"
    path = table(tmp_path / "t.csv", data)
    with pytest.raises(DataFileError, match=r"column 'age' has a missing value at .*t.csv line 4 \(1 in all\)"):
        build_federated_data(cfg(path, client_column="site", categorical=["smoker"]), seed=0)
    fed = build_federated_data(cfg(path, client_column="site", categorical=["smoker"], missing="impute",
                                   split_column=None), seed=0)
    x = all_x(fed.clients[0].train_eval)
    assert torch.isfinite(x).all()
    raw = fed.clients[0].train.parts[0].x
    assert torch.isnan(raw[:, 0]).sum() == 1 and (raw[:, 2:].sum(1) == 0).sum() == 1  # NA smoker: all zeros


def test_split_column(tmp_path: Path) -> None:
    data = [f"{r},{'test' if i % 4 == 0 else 'train'}" for i, r in enumerate(rows("a", 12) + rows("b", 8))]
    path = table(tmp_path / "t.csv", data, header="site,age,bp,smoker,y,part")
    fed = build_federated_data(cfg(path, client_column="site", categorical=["smoker"], split_column="part"), seed=0)
    assert [(len(c.train), len(c.test)) for c in fed.clients] == [(9, 3), (6, 2)]
    bad = table(tmp_path / "bad.csv", [data[0].replace(",test", ",valid")] + data[1:],
                header="site,age,bp,smoker,y,part")
    with pytest.raises(DataFileError, match="holds 'valid' at .*bad.csv line 2; its values must be train or test"):
        build_federated_data(cfg(bad, client_column="site", categorical=["smoker"], split_column="part"), seed=0)


@pytest.mark.parametrize("options, error, message", [
    ({"label": "yy"}, ConfigError, "data.options.label: no column 'yy' .*did you mean 'y'"),
    ({"client_column": "sites"}, ConfigError, "no column 'sites' .*did you mean 'site'"),
    ({"features": ["age", "bpp"]}, ConfigError, "features: no column 'bpp' .*did you mean 'bp'"),
    ({"categorical": ["smokr"]}, ConfigError, "categorical: 'smokr' is not a feature column.*did you mean"),
    ({"features": ["y"]}, ConfigError, "features lists 'y', which is the label"),
    ({"lable": "y"}, ConfigError, "unknown config key 'data.options.lable' .*did you mean 'label'"),
    ({"missing": "drop"}, ConfigError, "missing must be one of error, impute"),
])
def test_option_errors(tmp_path: Path, options: dict, error: type, message: str) -> None:
    path = table(tmp_path / "t.csv", rows("a", 6))
    with pytest.raises(error, match=message):
        build_federated_data(cfg(path, **{"client_column": "site", "categorical": ["smoker"], **options}), seed=0)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reads data.root"):
        build_federated_data(DataConfig(dataset="csv"), seed=0)
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        build_federated_data(cfg(tmp_path / "none.csv"), seed=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="holds no .csv files"):
        build_federated_data(cfg(tmp_path / "empty"), seed=0)
    ragged = table(tmp_path / "r.csv", ["a,1,2,no,0", "a,1,2,0"])
    with pytest.raises(DataFileError, match="r.csv' line 3 has 4 fields, the header 5"):
        build_federated_data(cfg(ragged, client_column="site"), seed=0)
    dup = table(tmp_path / "dup.csv", ["a,1,2,0"], header="site,age,age,y")
    with pytest.raises(DataFileError, match="duplicate column names \\(age\\)"):
        build_federated_data(cfg(dup, client_column="site"), seed=0)
    (tmp_path / "latin.csv").write_bytes("site,x,y\nzürich,1,0\n".encode("latin-1"))
    with pytest.raises(DataFileError, match="latin.csv' cannot be read .*UTF-8"):
        build_federated_data(cfg(tmp_path / "latin.csv", client_column="site"), seed=0)
    inf = table(tmp_path / "inf.csv", ["a,inf,1,no,0"])
    with pytest.raises(DataFileError, match="'inf' .*must be finite"):
        build_federated_data(cfg(inf, client_column="site", categorical=["smoker"]), seed=0)


def test_one_file_without_client_column_for_label_skew(tmp_path: Path) -> None:
    path = table(tmp_path / "pool.csv", rows("a", 40))
    fed = build_federated_data(DataConfig(dataset="csv", root=str(path), partition="dirichlet", num_clients=2,
                                          alpha=1.0, options={"label": "y", "features": ["age", "bp"]}), seed=0)
    assert [c.name for c in fed.clients] == ["client0", "client1"]


def test_shipped_example_config_runs_one_round(tmp_path: Path) -> None:
    from fedhet.launch.run import run_experiment

    path = write_example_csv(tmp_path / "hospitals.csv", rows_per_hospital=30)
    conf = load_config(REPO / "configs" / "csv_example.yaml",
                       [f"data.root={path}", "rounds=1", "run.quiet=true", "run.num_threads=1",
                        f"run.out_dir={tmp_path / 'runs'}", "method=fedbn"])
    result = run_experiment(conf, tmp_path / "run", progress=False)
    assert set(result.final) == {"east", "north", "south", "avg"}
    assert np.isfinite(result.final["avg"]["loss"])
