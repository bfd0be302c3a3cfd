"""Loaders for datasets not on this machine, on tiny fabricated files in the real layouts; error messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedhet.config import DataConfig
from fedhet.data import build_federated_data, dataset_info, list_datasets
from fedhet.data.digits import load_digits_domain
from fedhet.data.registry import LoadContext, get_spec
from fedhet.errors import ConfigError, DatasetNotFoundError


def _write_images(folder: Path, n: int, size: int = 12, ext: str = "png", seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (size, size + 3, 3), dtype=np.uint8)).save(folder / f"{i}.{ext}")


def test_officehome_folders_with_space_alias(tmp_path: Path) -> None:
    for dom in ("Art", "Real World"):
        for cls in ("Alarm_Clock", "Webcam"):
            _write_images(tmp_path / "OfficeHome" / dom / cls, 3)
    spec = get_spec("officehome")
    d = spec.loader(LoadContext(tmp_path, 16), "Real_World")
    assert d.x_train.shape == (6, 3, 16, 16) and d.x_train.dtype == torch.uint8
    assert sorted(set(d.y_train.tolist())) == [0, spec.classes.index("Webcam")]
    assert len(spec.classes) == 65


def test_office_caltech10_images_subfolder_and_caltech_alias(tmp_path: Path) -> None:
    _write_images(tmp_path / "office_caltech10" / "amazon" / "images" / "back_pack", 2, ext="jpg")
    _write_images(tmp_path / "office_caltech10" / "Caltech10" / "projector", 2)
    spec = get_spec("office_caltech10")
    assert spec.loader(LoadContext(tmp_path, 8), "amazon").y_train.tolist() == [0, 0]
    assert spec.loader(LoadContext(tmp_path, 8), "caltech").y_train.tolist() == [9, 9]


def test_domainnet_ignores_other_classes_and_builds(tmp_path: Path) -> None:
    for dom in ("clipart", "sketch"):
        for cls in ("bird", "zebra", "aircraft_carrier"):
            _write_images(tmp_path / "DomainNet" / dom / cls, 10, seed=len(dom))
    spec = get_spec("domainnet")
    d = spec.loader(LoadContext(tmp_path, 16), "clipart")
    assert len(d.y_train) == 20 and set(d.y_train.tolist()) == {0, 9}
    fed = build_federated_data(DataConfig(dataset="domainnet", root=str(tmp_path), domains=["clipart", "sketch"],
                                          image_size=16), seed=0)
    assert fed.input_shape == (3, 16, 16) and [c.name for c in fed.clients] == ["clipart", "sketch"]
    x, y = fed.clients[0].train[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64


def test_pacs_image_folders(tmp_path: Path) -> None:
    _write_images(tmp_path / "PACS" / "kfold" / "photo" / "dog", 2, ext="jpg")
    _write_images(tmp_path / "PACS" / "kfold" / "photo" / "person", 1, ext="jpg")
    d = get_spec("pacs").loader(LoadContext(tmp_path, 20), "photo")
    assert d.x_train.shape == (3, 3, 20, 20) and d.y_train.tolist() == [0, 0, 6]


def test_svhn_mat_layout(tmp_path: Path) -> None:
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    svhn = tmp_path / "digits" / "svhn"
    svhn.mkdir(parents=True)
    for split, n in (("train", 7), ("test", 3)):
        savemat(svhn / f"{split}_32x32.mat", {"X": rng.integers(0, 255, (32, 32, 3, n), dtype=np.uint8),
                                              "y": np.array([[10], [1], [2], [3], [4], [5], [6]][:n])})
    d = load_digits_domain(LoadContext(tmp_path, 28), "svhn")
    assert d.x_train.shape == (7, 3, 32, 32) and d.y_train.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert d.x_test is not None and d.y_test is not None and d.y_test.tolist() == [0, 1, 2]


def test_digits_npz_without_split_and_grey_hw(tmp_path: Path) -> None:
    (tmp_path / "digits").mkdir()
    np.savez(tmp_path / "digits" / "mnist.npz", x=np.zeros((20, 28, 28), np.uint8), y=np.arange(20) % 10)
    d = load_digits_domain(LoadContext(tmp_path, 28), "mnist")
    assert d.x_train.shape == (20, 3, 28, 28) and d.x_test is None


def test_missing_dataset_message(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        build_federated_data(DataConfig(dataset="officehome", root=str(tmp_path), domains=["Art"]), seed=0)
    msg = str(err.value)
    assert str(tmp_path / "OfficeHome" / "Art") in msg
    assert "hemanthdv.org" in msg and "<root>/OfficeHome/Art/<class>" in msg and "FEDHET_DATA" in msg


def test_missing_root_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDHET_DATA", raising=False)
    with pytest.raises(DatasetNotFoundError, match="no data root is set"):
        get_spec("heart_disease").loader(LoadContext(None, 0), "va")


def test_unknown_names_suggest_nearest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'officehome'"):
        dataset_info("office_home")
    with pytest.raises(ConfigError, match="did you mean 'mnist_m'"):
        build_federated_data(DataConfig(dataset="digits", domains=["mnistm"]), seed=0)
    with pytest.raises(ConfigError, match="did you mean 'dirichlet'"):
        build_federated_data(DataConfig(partition="dirichelt"), seed=0)


def test_registry_info() -> None:
    names = list_datasets()
    for n in ("digits", "pacs", "officehome", "office_caltech10", "domainnet", "office_caltech10_surf",
              "heart_disease", "offline_digits"):
        assert n in names
    info = dataset_info("digits")
    assert info.default_image_size == 28 and "synth_digits" in info.generated_domains
    assert "generated" in str(info) and "svhn" in str(info)
