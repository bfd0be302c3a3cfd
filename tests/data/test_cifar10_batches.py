"""CIFAR-10's pickled batches are read without running code: arrays and plain containers only."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedhet.data.cifar10 import read_cifar_batch
from fedhet.errors import DatasetNotFoundError


def write_batch(path: Path, n: int = 5) -> tuple[np.ndarray, list[int]]:
    data = np.arange(n * 3072, dtype=np.int64).astype(np.uint8).reshape(n, 3072)
    labels = [i % 10 for i in range(n)]
    with open(path, "wb") as f:  # the official release: a dict with bytes keys, protocol 2
        pickle.dump({b"batch_label": b"testing batch 1 of 1", b"data": data, b"labels": labels,
                     b"filenames": [b"x.png"] * n}, f, protocol=2)
    return data, labels


def test_a_batch_reads(tmp_path) -> None:
    data, labels = write_batch(tmp_path / "test_batch")
    images, got = read_cifar_batch(tmp_path / "test_batch")
    assert images.shape == (5, 32, 32, 3) and got.tolist() == labels
    assert np.array_equal(images.transpose(0, 3, 1, 2).reshape(5, 3072), data)


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_batch_is_refused_and_runs_nothing(tmp_path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": RunsCode(marker), b"labels": [0]}, protocol=2))
    with pytest.raises(DatasetNotFoundError, match="refusing posix.system"):
        read_cifar_batch(path)
    assert not marker.exists()
    with open(path, "rb") as f:  # the same file with a plain unpickler does run it: the test means something
        pickle.load(f)
    assert marker.exists()
