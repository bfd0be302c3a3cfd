"""Fed-ISIC2019 loader on a tiny fabricated directory in FLamby's layout (no real ISIC data is used)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedhet.config import DataConfig
from fedhet.data import build_federated_data, dataset_info
from fedhet.data import isic2019 as isic
from fedhet.data.registry import LoadContext
from fedhet.errors import DatasetNotFoundError

ONEHOT = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK")
# (image, target, center, fold, fold2): fold and fold2 disagree on purpose for two rows (FLamby's per-centre
# datasets read fold2; the pooled one reads fold)
ROWS = [
    ("ISIC_0000001", 0, 0, "train", "train_0"),
    ("ISIC_0000002", 1, 0, "train", "train_0"),
    ("ISIC_0000003", 7, 0, "test", "train_0"),
    ("ISIC_0000004", 2, 0, "train", "test_0"),
    ("ISIC_0000005", 1, 0, "test", "test_0"),
    ("ISIC_0000006", 3, 1, "train", "train_1"),
    ("ISIC_0000007", 4, 1, "train", "train_1"),
    ("ISIC_0000008_downsampled", 5, 1, "test", "test_1"),
    ("ISIC_0000009", 6, 5, "train", "train_5"),
    ("ISIC_0000010", 0, 5, "test", "test_5"),
]


def _write_split(path: Path, rows: list[tuple[str, int, int, str, str]], fold2: bool = True) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", *ONEHOT, "target", "center", "fold", *(["fold2"] if fold2 else [])])
        for image, target, center, fold, f2 in rows:
            onehot = [f"{float(i == target):.1f}" for i in range(len(ONEHOT))]
            w.writerow([image, *onehot, target, center, fold, *([f2] if fold2 else [])])


def _write_image(path: Path, width: int = 36, height: int = 24, value: int = 0) -> None:
    """A rectangular RGB image: red left margin, green centre square (value in blue), red right margin."""
    a = np.zeros((height, width, 3), np.uint8)
    a[..., 0] = 255
    m = (width - height) // 2
    a[:, m:m + height] = (0, 200, value)
    Image.fromarray(a).save(path, quality=100)


def fabricate(root: Path, rows: list[tuple[str, int, int, str, str]] = ROWS, fold2: bool = True) -> Path:
    """<root>/fed_isic2019/{ISIC_2019_Training_Input_preprocessed/*.jpg, train_test_split}."""
    base = root / "fed_isic2019"
    images = base / "ISIC_2019_Training_Input_preprocessed"
    images.mkdir(parents=True)
    for i, (image, *_rest) in enumerate(rows):
        _write_image(images / f"{image}.jpg", value=20 * i)
    _write_split(base / "train_test_split", rows, fold2)
    return base


def test_registered_with_flamby_classes_and_centres() -> None:
    info = dataset_info("isic2019")
    assert info.domains == tuple(f"center_{i}" for i in range(6))
    assert info.classes == ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
    assert info.modality == "image" and info.default_image_size == 200
    assert "FLamby" in info.source and "train_test_split" in info.layout


def test_centre_uses_fold2_split_and_square_crop(tmp_path: Path) -> None:
    fabricate(tmp_path)
    d = isic.load_isic_domain(LoadContext(tmp_path, 16), "center_0")
    assert d.x_train.shape == (3, 3, 16, 16) and d.x_train.dtype == torch.uint8
    assert d.y_train.tolist() == [0, 1, 7]  # fold2 = train_0 (ISIC_0000003 is fold=test but fold2=train_0)
    assert d.x_test is not None and d.y_test is not None
    assert d.x_test.shape == (2, 3, 16, 16) and d.y_test.tolist() == [2, 1]
    # the red margins are cropped away: only the green centre square remains
    # (a whole-image resize would keep a third of red, mean ~85; JPEG ringing leaves a little at the edges)
    assert float(d.x_train[:, 0].float().mean()) < 20 and float(d.x_train[:, 1].float().mean()) > 170
    assert "BCN" in d.note


def test_fold_column_when_no_fold2(tmp_path: Path) -> None:
    fabricate(tmp_path, fold2=False)
    d = isic.load_isic_domain(LoadContext(tmp_path, 12), "center_0")
    assert d.y_train.tolist() == [0, 1, 2] and d.y_test is not None and d.y_test.tolist() == [7, 1]


def test_federated_build_one_client_per_centre(tmp_path: Path) -> None:
    fabricate(tmp_path)
    fed = build_federated_data(DataConfig(dataset="isic2019", root=str(tmp_path),
                                          domains=["center_1", "center_5"], image_size=16, augment=False), seed=0)
    assert [c.name for c in fed.clients] == ["center_1", "center_5"]
    assert fed.num_classes == 8 and fed.input_shape == (3, 16, 16)
    assert [len(c.train) for c in fed.clients] == [2, 1] and [len(c.test) for c in fed.clients] == [1, 1]
    x, y = fed.clients[0].test[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and int(y) == 5


def test_missing_folder_names_flamby_scripts(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as e:
        isic.load_isic_domain(LoadContext(tmp_path, 16), "center_2")
    msg = str(e.value)
    assert "fed_isic2019/ISIC_2019_Training_Input_preprocessed" in msg
    assert "download_isic.py" in msg and "resize_images.py" in msg and "train_test_split" in msg
    with pytest.raises(DatasetNotFoundError, match="no data root is set"):
        isic.load_isic_domain(LoadContext(None, 16), "center_2")


def test_missing_split_file_and_missing_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = fabricate(tmp_path)
    monkeypatch.setattr(isic, "_flamby_split_file", lambda: None)
    (base / "train_test_split").rename(base / "elsewhere.csv")
    with pytest.raises(DatasetNotFoundError, match="train_test_split"):
        isic.load_isic_domain(LoadContext(tmp_path, 16), "center_0")
    (base / "elsewhere.csv").rename(base / "train_test_split.csv")  # the .csv name is accepted too
    assert len(isic.load_isic_domain(LoadContext(tmp_path, 16), "center_0").y_train) == 3
    (base / "ISIC_2019_Training_Input_preprocessed" / "ISIC_0000002.jpg").unlink()
    with pytest.raises(DatasetNotFoundError, match="1 of the 3 images .* ISIC_0000002.jpg"):
        isic.load_isic_domain(LoadContext(tmp_path, 16), "center_0")


def test_not_a_flamby_split_file(tmp_path: Path) -> None:
    base = fabricate(tmp_path)
    (base / "train_test_split").write_text("image,label\nISIC_0000001,0\n")
    with pytest.raises(DatasetNotFoundError, match="not FLamby's Fed-ISIC2019 split file"):
        isic.load_isic_domain(LoadContext(tmp_path, 16), "center_0")
