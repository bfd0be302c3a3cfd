"""`data.download: true` with fakes (nothing is downloaded): torchvision MNIST/USPS and the Hugging Face hub."""

from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedhet.config import DataConfig
from fedhet.data import build_federated_data
from fedhet.data.download import materialize
from fedhet.data.registry import LoadContext, get_spec
from fedhet.errors import DatasetNotFoundError


def _leftovers(root: Path) -> list[Path]:
    """Temporary files/folders anywhere under root (all start with '.' or end in '.tmp')."""
    return [p for p in root.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]


# ---------------------------------------------------------------------------------------- torchvision digits


def _fake_torchvision(calls: list, n_train: int, n_test: int, hw: int, numpy_data: bool):
    """A stand-in for torchvision.datasets.MNIST/USPS: `data` NxHxW uint8 and `targets`, nothing fetched."""

    class Fake:
        def __init__(self, root: str, train: bool = True, download: bool = False, **_: object) -> None:
            assert download and Path(root).is_dir()
            calls.append(train)
            n = n_train if train else n_test
            data = np.full((n, hw, hw), 7 if train else 200, np.uint8)
            targets = np.arange(n) % 10
            self.data = data if numpy_data else torch.from_numpy(data)
            self.targets = targets.tolist() if numpy_data else torch.from_numpy(targets)

    return Fake


def _failing(*_: object, **__: object):
    raise AssertionError("the downloader was called")


def test_mnist_usps_download_once_then_read_from_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, list] = {"MNIST": [], "USPS": []}
    monkeypatch.setattr("torchvision.datasets.MNIST", _fake_torchvision(calls["MNIST"], 30, 20, 28, False))
    monkeypatch.setattr("torchvision.datasets.USPS", _fake_torchvision(calls["USPS"], 20, 10, 16, True))
    cfg = DataConfig(dataset="digits", root=str(tmp_path), domains=["mnist", "usps"], download=True)
    fed = build_federated_data(cfg, seed=0)
    assert calls == {"MNIST": [True, False], "USPS": [True, False]}
    assert [c.name for c in fed.clients] == ["mnist", "usps"] and fed.input_shape == (3, 28, 28)

    digits = tmp_path / "digits"
    assert sorted(p.name for p in digits.iterdir()) == ["mnist.npz", "usps.npz"]  # no temp files, no raw download
    assert _leftovers(tmp_path) == []
    with np.load(digits / "usps.npz") as z:
        assert z["x"].dtype == np.uint8 and z["x"].shape == (30, 16, 16)
        assert z["y"].dtype == np.int64 and z["y"].tolist() == list(np.arange(20) % 10) + list(np.arange(10) % 10)
        assert z["split"].tolist() == [0] * 20 + [1] * 10
        assert (z["x"][z["split"] == 1] == 200).all()
    d = get_spec("digits").loader(LoadContext(tmp_path, 28), "mnist")  # download off: reads the npz
    assert d.x_train.shape == (30, 3, 28, 28) and d.x_test is not None and d.x_test.shape == (20, 3, 28, 28)

    monkeypatch.setattr("torchvision.datasets.MNIST", _failing)
    monkeypatch.setattr("torchvision.datasets.USPS", _failing)
    again = build_federated_data(cfg, seed=0)
    assert [len(c.train) for c in again.clients] == [len(c.train) for c in fed.clients]


def test_digits_errors_without_download_or_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torchvision.datasets.MNIST", _failing)
    loader = get_spec("digits").loader
    with pytest.raises(DatasetNotFoundError) as err:  # download off: never downloads
        loader(LoadContext(tmp_path, 28, download=False), "mnist")
    assert "data.download=true" in str(err.value) and "digits/mnist.npz" in str(err.value)
    monkeypatch.delenv("FEDHET_DATA", raising=False)
    with pytest.raises(DatasetNotFoundError, match="no data root is set.*FEDHET_DATA"):
        loader(LoadContext(None, 28, download=True), "usps")
    with pytest.raises(DatasetNotFoundError, match="MNIST-M has no torchvision dataset.*FedBN"):
        loader(LoadContext(tmp_path, 28, download=True), "mnist_m")
    assert not (tmp_path / "digits").exists() or _leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------- Hugging Face hub


class ClassLabel:  # named like datasets.ClassLabel: the loader finds label names by the feature's type name
    def __init__(self, names: list[str]) -> None:
        self.names = names


class FakeSplit:
    """A tiny stand-in for datasets.Dataset: rows of dicts, column access, select, features."""

    def __init__(self, rows: list[dict], features: dict) -> None:
        self.rows, self.features = rows, features
        self.column_names = list(features)

    def __getitem__(self, key: str) -> list:
        return [r[key] for r in self.rows]

    def select(self, idx: list[int]) -> FakeSplit:
        return FakeSplit([self.rows[i] for i in idx], self.features)

    def __iter__(self):
        return iter(self.rows)


def _img(v: int, size: tuple[int, int] = (10, 8)) -> Image.Image:
    return Image.fromarray(np.full((size[1], size[0], 3), v, np.uint8))


def _fake_hf(monkeypatch: pytest.MonkeyPatch, rows: list[dict], class_names: list[str]) -> list:
    calls: list = []

    def load_dataset(repo: str, **kwargs: object) -> dict:
        calls.append(repo)
        return {"train": FakeSplit(rows, {"image": object(), "domain": object(), "label": ClassLabel(class_names)})}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_officehome_from_hub_all_missing_domains_in_one_pass(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["Alarm_Clock", "Webcam", "Not_A_Class"]
    rows = [{"image": _img(10 * i), "domain": dom, "label": lab}
            for i, (dom, lab) in enumerate([("Real World", 0), ("Real World", 1), ("Real World", 1), ("Art", 0),
                                            ("Art", 2), ("Clipart", 1)])]
    (tmp_path / "OfficeHome" / "Clipart" / "Webcam").mkdir(parents=True)  # already there: not touched
    _img(5).save(tmp_path / "OfficeHome" / "Clipart" / "Webcam" / "mine.png")
    calls = _fake_hf(monkeypatch, rows, names)
    loader = get_spec("officehome").loader
    d = loader(LoadContext(tmp_path, 12, download=True), "Real_World")
    assert calls == ["flwrlabs/office-home"]
    spec = get_spec("officehome")
    assert d.x_train.shape == (3, 3, 12, 12) and sorted(d.y_train.tolist()) == [0, 64, 64]
    base = tmp_path / "OfficeHome"
    assert sorted(p.name for p in base.iterdir()) == ["Art", "Clipart", "Real_World"]
    assert sorted(p.name for p in (base / "Art").iterdir()) == ["Alarm_Clock"]  # unknown class dropped
    assert [p.name for p in (base / "Clipart" / "Webcam").iterdir()] == ["mine.png"]
    assert spec.classes[64] == "Webcam" and len(list((base / "Real_World" / "Webcam").glob("*.png"))) == 2
    assert _leftovers(tmp_path) == []

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=_failing))
    assert loader(LoadContext(tmp_path, 12, download=True), "Art").y_train.tolist() == [0]  # read from disk


def test_pacs_from_hub_through_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pacs = list(get_spec("pacs").classes)
    rows = [{"image": _img(i), "domain": dom, "label": i % 7} for dom in ("photo", "sketch") for i in range(14)]
    calls = _fake_hf(monkeypatch, rows, pacs)
    cfg = DataConfig(dataset="pacs", root=str(tmp_path), domains=["photo", "sketch"], image_size=16,
                     test_fraction=0.5, download=True)
    fed = build_federated_data(cfg, seed=0)
    assert calls == ["flwrlabs/pacs"] and [c.name for c in fed.clients] == ["photo", "sketch"]
    assert sorted(p.name for p in (tmp_path / "PACS" / "photo").iterdir()) == sorted(pacs)
    assert _leftovers(tmp_path) == []


def test_hub_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = get_spec("domainnet").loader
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(DatasetNotFoundError, match="pip install datasets") as err:
        loader(LoadContext(tmp_path, 16, download=True), "clipart")
    assert "flwrlabs/domainnet" in str(err.value)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=_failing))
    with pytest.raises(DatasetNotFoundError) as err:  # download off: never calls the hub
        loader(LoadContext(tmp_path, 16), "clipart")
    assert "data.download=true" in str(err.value) and "DomainNet/clipart" in str(err.value)
    monkeypatch.delenv("FEDHET_DATA", raising=False)
    with pytest.raises(DatasetNotFoundError, match="no data root is set"):
        loader(LoadContext(None, 16, download=True), "clipart")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------- the shared writer


def test_materialize_keeps_encoded_bytes_and_cleans_up_on_failure(tmp_path: Path) -> None:
    buf = io.BytesIO()
    _img(90).save(buf, format="JPEG")
    jpeg = buf.getvalue()
    out = materialize([("a", "Dog", {"bytes": jpeg, "path": None})], tmp_path, ["dog"], "folder")
    files = list((out["a"] / "dog").iterdir())
    assert len(files) == 1 and files[0].suffix == ".jpg" and files[0].read_bytes() == jpeg

    def broken():
        yield "b", "dog", _img(1)
        yield "c", "dog", np.zeros((4, 4), np.uint8)
        raise OSError("connection reset")

    for fmt in ("folder", "npz"):
        with pytest.raises(OSError, match="connection reset"):
            materialize(broken(), tmp_path, ["dog"], fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"] and _leftovers(tmp_path) == []


def test_images_are_written_as_grey_or_rgb_whatever_mode_they_come_in(tmp_path: Path) -> None:
    """An RGBA or palette image becomes RGB, in an npz and in a folder's PNG; a grey one stays grey."""
    rgba = Image.new("RGBA", (4, 3), (10, 20, 30, 40))
    materialize(iter([("a", "x", rgba, 0), ("a", "x", rgba.convert("P"), 0)]), tmp_path / "npz", ["x"], "npz")
    with np.load(tmp_path / "npz" / "a.npz") as z:
        assert z["x"].shape == (2, 3, 4, 3) and (z["x"][0] == [10, 20, 30]).all()
    written = materialize(iter([("a", "x", rgba), ("a", "x", Image.new("L", (4, 3)))]), tmp_path / "folder", ["x"],
                          "folder")
    assert sorted(Image.open(p).mode for p in (written["a"] / "x").iterdir()) == ["L", "RGB"]


def test_hub_columns_are_found_by_their_feature_type_before_their_name() -> None:
    from fedhet.data.download import _columns

    typed_image = type("Image", (), {})()  # named like datasets.Image
    split = FakeSplit([], {"image": object(), "photo": typed_image, "label": object(), "kind": ClassLabel(["cat"]),
                           "domain": object()})
    image_col, label_col, domain_col, class_name = _columns(split)
    assert (image_col, label_col, domain_col, class_name(0)) == ("photo", "kind", "domain", "cat")
