"""CIFAR-10 loader: the python-release layout fabricated from real CIFAR-10 images (or noise), the npz form,
channel order, corrupt and missing files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from fedhet.config import DataConfig
from fedhet.data import build_federated_data, dataset_info
from fedhet.data import cifar10 as c10
from fedhet.data.registry import LoadContext
from fedhet.errors import DatasetNotFoundError


def write_batch(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """One batch in the official format: data N x 3072 (R, G, B planes, row-major), labels a list."""
    data = np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), -1).astype(np.uint8)
    with open(path, "wb") as f:
        pickle.dump({b"data": data, b"labels": [int(v) for v in labels], b"batch_label": b"fabricated"}, f)


def fabricate(folder: Path, images: np.ndarray, labels: np.ndarray, n_test: int) -> None:
    """The last `n_test` images as test_batch, the rest spread over data_batch_1..5."""
    folder.mkdir(parents=True, exist_ok=True)
    train_x, train_y = images[:-n_test], labels[:-n_test]
    for k, idx in enumerate(np.array_split(np.arange(len(train_x)), 5), start=1):
        write_batch(folder / f"data_batch_{k}", train_x[idx], train_y[idx])
    write_batch(folder / "test_batch", images[-n_test:], labels[-n_test:])


def _noise(n: int = 120) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8), np.arange(n) % 10


def test_registered_single_domain() -> None:
    info = dataset_info("cifar10")
    assert info.domains == ("cifar10",) and info.classes[0] == "airplane" and info.classes[9] == "truck"
    assert info.default_image_size == 32


def test_real_images_round_trip_in_official_layout(tmp_path: Path, data_root: Path) -> None:
    """Real CIFAR-10 test images (shared subset) written as the python release read back pixel for pixel."""
    subset = data_root / "cifar10" / "test_subset.npz"
    if not subset.is_file():
        pytest.skip(f"{subset} not present")
    with np.load(subset) as z:
        x, y = z["x"], z["y"]
    fabricate(tmp_path / "cifar10" / c10.BATCH_FOLDER, x, y, n_test=200)
    d = c10.load_cifar10(LoadContext(tmp_path, 32), "cifar10")
    assert d.x_train.shape == (800, 3, 32, 32) and d.x_test is not None and d.x_test.shape == (200, 3, 32, 32)
    np.testing.assert_array_equal(d.x_train.numpy().transpose(0, 2, 3, 1), x[:800])  # R, G, B planes -> HWC
    np.testing.assert_array_equal(d.y_test.numpy(), y[800:])  # type: ignore[union-attr]


def test_top_level_folder_and_npz_forms(tmp_path: Path) -> None:
    x, y = _noise()
    fabricate(tmp_path / c10.BATCH_FOLDER, x, y, n_test=20)
    d = c10.load_cifar10(LoadContext(tmp_path, 32), "cifar10")
    assert len(d.y_train) == 100 and d.note.endswith(c10.BATCH_FOLDER)
    other = tmp_path / "npz_root"
    (other / "cifar10").mkdir(parents=True)
    np.savez(other / "cifar10" / "cifar10.npz", x=x, y=y, split=(np.arange(len(y)) >= 100).astype(np.int64))
    d = c10.load_cifar10(LoadContext(other, 32), "cifar10")
    assert len(d.y_train) == 100 and d.y_test is not None and len(d.y_test) == 20


def test_dirichlet_clients(tmp_path: Path) -> None:
    x, y = _noise()
    fabricate(tmp_path / "cifar10" / c10.BATCH_FOLDER, x, y, n_test=20)
    cfg = DataConfig(dataset="cifar10", root=str(tmp_path), partition="dirichlet", num_clients=5, alpha=0.5,
                     augment=False)
    fed = build_federated_data(cfg, seed=0)
    assert len(fed.clients) == 5 and fed.input_shape == (3, 32, 32) and fed.num_classes == 10
    assert sum(len(c.train) for c in fed.clients) == 100 and sum(len(c.test) for c in fed.clients) == 20


def test_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as e:
        c10.load_cifar10(LoadContext(tmp_path, 32), "cifar10")
    assert "cifar-10-batches-py" in str(e.value) and "cs.toronto.edu" in str(e.value)
    with pytest.raises(DatasetNotFoundError, match="no data root is set"):
        c10.load_cifar10(LoadContext(None, 32), "cifar10")
    with pytest.raises(DatasetNotFoundError, match="nowhere to put the download"):
        c10.load_cifar10(LoadContext(None, 32, download=True), "cifar10")
    x, y = _noise()
    folder = tmp_path / "cifar10" / c10.BATCH_FOLDER
    fabricate(folder, x, y, n_test=20)
    (folder / "data_batch_3").write_bytes(b"\x80\x04not a pickle")
    with pytest.raises(DatasetNotFoundError, match="data_batch_3 is not a readable CIFAR-10 batch"):
        c10.load_cifar10(LoadContext(tmp_path, 32), "cifar10")
    write_batch(folder / "data_batch_3", x[:5], np.full(5, 12))
    with pytest.raises(DatasetNotFoundError, match="labels outside 0..9"):
        c10.load_cifar10(LoadContext(tmp_path, 32), "cifar10")
