"""Each loader on the staged real data (skipped when absent); only small domains are loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.data.digits import load_digits_domain
from fedhet.data.features import load_heart_domain, load_surf_domain, parse_heart_csv
from fedhet.data.registry import LoadContext, get_spec


def need(path: Path) -> Path:
    """Skip unless `path` exists."""
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def test_usps_npz_official_split(data_root: Path) -> None:
    need(data_root / "digits" / "usps.npz")
    d = load_digits_domain(LoadContext(data_root, 28), "usps")
    assert d.x_train.shape == (7291, 3, 16, 16) and d.x_train.dtype == torch.uint8  # native 16x16
    assert d.x_test is not None and len(d.x_test) == 2007
    assert torch.equal(d.x_train[:, 0], d.x_train[:, 2])  # grey repeated to 3 channels
    assert not d.generated


def test_mnist_m_is_colour(data_root: Path) -> None:
    need(data_root / "digits" / "mnist_m.npz")
    d = load_digits_domain(LoadContext(data_root, 28), "mnist_m")
    assert d.x_train.shape[1:] == (3, 32, 32) and len(d.y_train) == 5000
    assert not torch.equal(d.x_train[:, 0], d.x_train[:, 1])


def test_surf_npz_matches_original_mat(data_root: Path, tmp_path: Path) -> None:
    need(data_root / "office_caltech10_surf" / "dslr.npz")
    npz = load_surf_domain(LoadContext(data_root, 0), "dslr")
    assert npz.x_train.shape == (157, 800) and npz.x_train.dtype == torch.float32
    mat_dir = need(data_root / "office_caltech10_surf" / "original_mat")
    # a root holding only the .mat file exercises the .mat path
    (tmp_path / "office_caltech10_surf").mkdir()
    (tmp_path / "office_caltech10_surf" / "dslr_SURF_L10.mat").symlink_to(mat_dir / "dslr_SURF_L10.mat")
    mat = load_surf_domain(LoadContext(tmp_path, 0), "dslr")
    assert torch.equal(mat.x_train, npz.x_train) and torch.equal(mat.y_train, npz.y_train)
    assert get_spec("office_caltech10_surf").classes[0] == "back_pack"


def test_heart_disease_parse(data_root: Path) -> None:
    path = need(data_root / "uci_heart_disease" / "processed.cleveland.data")
    x, y = parse_heart_csv(path)
    assert x.shape == (303, 13) and int(np.isnan(x).sum()) == 6
    assert set(np.unique(y)) == {0, 1}
    d = load_heart_domain(LoadContext(data_root, 0), "switzerland")
    assert d.x_train.shape == (123, 13) and d.x_test is None


def test_pacs_npz(data_root: Path) -> None:
    need(data_root / "pacs" / "sketch.npz")
    d = get_spec("pacs").loader(LoadContext(data_root, 64), "sketch")
    assert d.x_train.shape == (2357, 3, 128, 128) and d.x_test is None
    assert int(d.y_train.max()) == 6
