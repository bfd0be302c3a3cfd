"""Fashion-MNIST loader: fabricated IDX files (gzipped and plain), errors, and Debian's copy when installed."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.config import DataConfig
from fedhet.data import build_federated_data, dataset_info
from fedhet.data import fashion_mnist as fm
from fedhet.data.registry import LoadContext
from fedhet.errors import DatasetNotFoundError


def write_idx(path: Path, arr: np.ndarray) -> None:
    """An IDX file of uint8 data (gzipped when the name ends in .gz)."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    raw = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)


def fabricate(folder: Path, n_train: int = 200, n_test: int = 50, seed: int = 0) -> dict[str, np.ndarray]:
    """Train files gzipped, test files plain; labels cycle 0..9; returns the arrays written."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"x_train": rng.integers(0, 256, (n_train, 28, 28)), "y_train": np.arange(n_train) % 10,
              "x_test": rng.integers(0, 256, (n_test, 28, 28)), "y_test": (np.arange(n_test) * 3) % 10}
    for key, stem in fm.FILES.items():
        write_idx(folder / (f"{stem}.gz" if key.endswith("train") else stem), arrays[key])
    return arrays


@pytest.fixture
def no_debian(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hide an installed Debian copy so only the data root is searched."""
    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path / "no_debian_copy")


def test_registered_single_domain() -> None:
    info = dataset_info("fashion_mnist")
    assert info.domains == ("fashion_mnist",) and len(info.classes) == 10 and info.classes[9] == "Ankle boot"
    assert info.default_image_size == 28 and "dataset-fashion-mnist" in info.source


def test_read_idx_gz_and_plain_match_torchvision(tmp_path: Path) -> None:
    from torchvision.datasets.mnist import read_image_file

    arrays = fabricate(tmp_path / "fashion_mnist")
    x = fm.read_idx(tmp_path / "fashion_mnist" / "train-images-idx3-ubyte.gz")
    assert x.shape == (200, 28, 28) and x.dtype == np.uint8 and np.array_equal(x, arrays["x_train"])
    plain = tmp_path / "fashion_mnist" / "t10k-images-idx3-ubyte"
    assert torch.equal(torch.from_numpy(fm.read_idx(plain).copy()), read_image_file(str(plain)))


def test_loader_official_split_grey_to_rgb(tmp_path: Path, no_debian: None) -> None:
    arrays = fabricate(tmp_path / "fashion_mnist")
    d = fm.load_fashion_mnist(LoadContext(tmp_path, 28), "fashion_mnist")
    assert d.x_train.shape == (200, 3, 28, 28) and d.x_train.dtype == torch.uint8
    assert torch.equal(d.x_train[:, 0], torch.from_numpy(arrays["x_train"].astype(np.uint8)))
    assert torch.equal(d.x_train[:, 0], d.x_train[:, 2])
    assert d.y_train.dtype == torch.int64 and d.y_train.tolist() == arrays["y_train"].tolist()
    assert d.x_test is not None and d.y_test is not None and d.x_test.shape == (50, 3, 28, 28)
    assert d.y_test.tolist() == arrays["y_test"].tolist() and not d.generated


def test_torchvision_raw_folder(tmp_path: Path, no_debian: None) -> None:
    fabricate(tmp_path / "FashionMNIST" / "raw", n_train=30, n_test=10)
    d = fm.load_fashion_mnist(LoadContext(tmp_path, 28), "fashion_mnist")
    assert len(d.y_train) == 30 and d.note.endswith("raw")


def test_dirichlet_five_clients(tmp_path: Path, no_debian: None) -> None:
    fabricate(tmp_path / "fashion_mnist")
    cfg = DataConfig(dataset="fashion_mnist", root=str(tmp_path), partition="dirichlet", num_clients=5, alpha=0.5,
                     augment=False)
    fed = build_federated_data(cfg, seed=0)
    assert [c.name for c in fed.clients] == [f"client{k}" for k in range(5)]
    assert {c.domain for c in fed.clients} == {"fashion_mnist"}
    assert sum(len(c.train) for c in fed.clients) == 200 and sum(len(c.test) for c in fed.clients) == 50
    assert fed.input_shape == (3, 28, 28) and fed.num_classes == 10
    again = build_federated_data(cfg, seed=0)
    assert [len(c.train) for c in fed.clients] == [len(c.train) for c in again.clients]


def test_missing_files_error_names_debian_package(tmp_path: Path, no_debian: None) -> None:
    with pytest.raises(DatasetNotFoundError) as e:
        fm.load_fashion_mnist(LoadContext(tmp_path, 28), "fashion_mnist")
    msg = str(e.value)
    assert "apt-get install dataset-fashion-mnist" in msg and "zalandoresearch" in msg
    assert "fashion_mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]" in msg
    assert "train-images-idx3-ubyte[.gz]" in msg
    (tmp_path / "fashion_mnist").mkdir()
    (tmp_path / "fashion_mnist" / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03")  # only one file
    with pytest.raises(DatasetNotFoundError, match="no data root is set"):
        fm.load_fashion_mnist(LoadContext(None, 28), "fashion_mnist")


def test_corrupt_idx(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x05abc")
    with pytest.raises(DatasetNotFoundError, match="not an IDX file"):
        fm.read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05abc")
    with pytest.raises(DatasetNotFoundError, match="truncated"):
        fm.read_idx(short)


@pytest.mark.skipif(not (fm.DEBIAN_DIR / "train-labels-idx1-ubyte.gz").is_file(),
                    reason=f"Debian's Fashion-MNIST is not installed ({fm.DEBIAN_DIR}; "
                           "apt-get install dataset-fashion-mnist)")
def test_real_debian_copy_used_when_root_lacks_it(tmp_path: Path) -> None:
    d = fm.load_fashion_mnist(LoadContext(tmp_path, 28), "fashion_mnist")
    assert d.note == str(fm.DEBIAN_DIR)
    assert d.x_train.shape == (60000, 3, 28, 28) and d.x_test is not None and d.x_test.shape == (10000, 3, 28, 28)
    assert d.y_train.bincount().tolist() == [6000] * 10 and d.y_test is not None
    assert d.y_test.bincount().tolist() == [1000] * 10
    assert int(d.y_train[0]) == 9 and int(d.y_test[0]) == 9  # both files start with an ankle boot
