"""Digits as FedBN / FRAug used it: FedBN's per-domain amounts and 80/20 split, images read at native size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from fedhet.config import DataConfig
from fedhet.data import build_federated_data
from fedhet.data.digits import load_digits_domain
from fedhet.data.fedbn_split import check_percent, train_size
from fedhet.data.registry import LoadContext
from fedhet.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from fedhet.errors import ConfigError


def _write_digits(root: Path, name: str, n_train: int, n_test: int, native: int | None = None) -> None:
    """A fabricated digits/<name>.npz: balanced labels, `x` 32x32 and optionally a different `x_native`."""
    rng = np.random.default_rng(len(name))
    n = n_train + n_test
    arrays = {"x": rng.integers(0, 256, (n, 32, 32), dtype=np.uint8), "y": np.arange(n) % 10,
              "split": np.r_[np.zeros(n_train, np.uint8), np.ones(n_test, np.uint8)]}
    if native is not None:
        arrays["x_native"] = rng.integers(0, 256, (n, native, native), dtype=np.uint8)
    (root / "digits").mkdir(exist_ok=True)
    np.savez(root / "digits" / f"{name}.npz", **arrays)


def _fed(root: Path, seed: int = 0, **kw: object) -> object:
    cfg = DataConfig(dataset="digits", root=str(root), domains=["mnist", "usps"], augment=False, **kw)  # type: ignore[arg-type]
    return build_federated_data(cfg, seed)


def _rows(ds: object) -> set[tuple[int, ...]]:
    """Every sample of a client split as its raw pixels (to compare splits across builds)."""
    return {tuple(p.x[int(i)].flatten()[:64].tolist()) for p in ds.parts for i in p.index}  # type: ignore[attr-defined]


def test_fedbn_train_sizes_match_fedbn_percent() -> None:
    # FedBN utils/data_preprocess.py: partitions of 743.8 images; percent < 0.1 keeps int(743 * 10 p) of part 0
    assert [train_size(p) for p in (0.01, 0.05, 0.1, 0.2, 0.5, 1.0)] == [74, 371, 743, 1487, 3719, 7438]


@pytest.mark.parametrize(("percent", "dataset", "needle"), [
    (0.01, "pacs", "'digits' only"), (0.15, "digits", "whole 10% partitions"), (0.0, "digits", "(0, 1]"),
    (1.5, "digits", "(0, 1]"), (0.0001, "digits", "no training image")])
def test_fedbn_percent_bad_values(percent: float, dataset: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_percent(percent, dataset)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_fedbn_split_amounts_and_fixed_for_every_seed(tmp_path: Path) -> None:
    _write_digits(tmp_path, "mnist", 1500, 500)
    _write_digits(tmp_path, "usps", 700, 300)
    fed = _fed(tmp_path, fedbn_percent=0.01)
    mnist, usps = fed.clients  # type: ignore[attr-defined]
    assert mnist.num_train == usps.num_train == 74  # FedBN: the same amount for every domain
    assert len(mnist.test) == 400 and len(usps.test) == 200  # 20% of the pooled domain (2,000 / 1,000)
    counts = np.bincount(mnist.train.labels, minlength=10)
    assert counts.max() - counts.min() <= 1  # stratified
    assert not _rows(mnist.train) & _rows(mnist.test)
    other = _fed(tmp_path, seed=1, fedbn_percent=0.01).clients[0]  # type: ignore[attr-defined]
    assert _rows(other.train) == _rows(mnist.train) and _rows(other.test) == _rows(mnist.test)
    larger = _fed(tmp_path, fedbn_percent=0.1).clients[0]  # type: ignore[attr-defined]
    assert larger.num_train == 743 and _rows(mnist.train) < _rows(larger.train)  # nested, as FedBN's prefixes
    assert _rows(larger.test) == _rows(mnist.test)


def test_fedbn_percent_more_than_the_domain_holds(tmp_path: Path) -> None:
    _write_digits(tmp_path, "mnist", 400, 100)
    _write_digits(tmp_path, "usps", 400, 100)
    with pytest.raises(ConfigError, match="asks for 743 training images of 'mnist'"):
        _fed(tmp_path, fedbn_percent=0.1)


def test_default_keeps_official_split(tmp_path: Path) -> None:
    _write_digits(tmp_path, "mnist", 300, 100)
    _write_digits(tmp_path, "usps", 300, 100)
    fed = _fed(tmp_path)
    assert [c.num_train for c in fed.clients] == [300, 300] and len(fed.clients[0].test) == 100  # type: ignore[attr-defined]


def test_npz_read_at_native_resolution(tmp_path: Path) -> None:
    _write_digits(tmp_path, "usps", 30, 10, native=16)
    d = load_digits_domain(LoadContext(tmp_path, 28), "usps")
    assert d.x_train.shape[1:] == (3, 16, 16)
    with np.load(tmp_path / "digits" / "usps.npz") as z:
        native = torch.from_numpy(z["x_native"][0]).expand(3, 16, 16)
    assert torch.equal(d.x_train[0], native)


def test_client_images_resized_once_from_native(tmp_path: Path) -> None:
    _write_digits(tmp_path, "mnist", 30, 10, native=28)
    _write_digits(tmp_path, "usps", 30, 10, native=16)
    fed = _fed(tmp_path, image_size=28)
    with np.load(tmp_path / "digits" / "usps.npz") as z:
        native, label = z["x_native"][30], int(z["y"][30])  # the first test image
    once = v2.Compose([v2.Resize((28, 28), antialias=True), v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])(torch.from_numpy(native).expand(3, 16, 16))
    x, y = fed.clients[1].test[0]  # type: ignore[attr-defined]
    assert int(y) == label and torch.allclose(x, once)
    assert fed.clients[0].test.parts[0].x.shape[2:] == (28, 28)  # type: ignore[attr-defined]  # MNIST: no resize


def test_real_digits_native_and_fedbn_usps(data_root: Path) -> None:
    if not (data_root / "digits" / "usps.npz").is_file() or not (data_root / "digits" / "mnist.npz").is_file():
        pytest.skip("staged digits absent")
    assert load_digits_domain(LoadContext(data_root, 28), "mnist").x_test.shape[1:] == (3, 28, 28)  # type: ignore[union-attr]
    fed = _fed(data_root, fedbn_percent=0.01)
    usps = fed.clients[1]  # type: ignore[attr-defined]
    assert usps.train.parts[0].x.shape[2:] == (16, 16)
    assert usps.num_train == 74 and len(usps.test) == 1860  # FedBN's USPS test split: 20% of 9,298
