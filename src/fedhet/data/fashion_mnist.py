"""Fashion-MNIST (Xiao et al. 2017) from local IDX files: one domain, 10 classes, 28x28 grey, official split.

Looked for, in this order:

    <root>/fashion_mnist/{train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
                          t10k-labels-idx1-ubyte}[.gz]
    <root>/fashion-mnist/...  and torchvision's  <root>/FashionMNIST/raw/...
    /usr/share/datasets/fashion-mnist/...   (Debian/Ubuntu: apt-get install dataset-fashion-mnist)

The Debian copy is used when no data root holds the files (or no root is set), so the dataset works offline
on a machine with that package. Each file may be gzipped (`.gz`) or plain; the plain one is preferred.
It is a single domain meant for label-skew partitions (`data.partition: dirichlet`, `num_clients`, `alpha`).
Grey images are repeated to 3 channels like every image domain in fedhet.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.data.files import missing_dataset, to_uint8_chw
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset
from fedhet.errors import DatasetNotFoundError

FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
FASHION_FOLDERS = ("fashion_mnist", "fashion-mnist", "FashionMNIST/raw")
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")  # package dataset-fashion-mnist
FILES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
         "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
FASHION_SRC = ("Xiao, Rasul & Vollgraf 2017, https://github.com/zalandoresearch/fashion-mnist (the four "
               "*-ubyte.gz files); on Debian/Ubuntu: apt-get install dataset-fashion-mnist (installs them into "
               f"{DEBIAN_DIR}, used automatically)")
FASHION_LAYOUT = "fashion_mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"
_IDX_DTYPES: dict[int, np.dtype[Any]] = {  # Any: numpy dtypes of several scalar types
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
                                         0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format; gzipped when the name ends in .gz) as a numpy array."""
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            raw = f.read()
    else:
        raw = path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DatasetNotFoundError(f"{path} is not an IDX file (bad magic number)")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    expected = offset + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise DatasetNotFoundError(f"{path}: {len(raw)} bytes, expected {expected} for shape {shape} (truncated?)")
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(shape).astype(dtype.newbyteorder("="))


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, f"{stem}.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def fashion_mnist_dirs(root: Path | None) -> list[Path]:
    """The folders searched, in order: those under the data root, then Debian's install location."""
    under_root = [root / f for f in FASHION_FOLDERS] if root is not None else []
    return [*under_root, DEBIAN_DIR]


def load_fashion_mnist(ctx: LoadContext, domain: str) -> DomainData:
    """The single Fashion-MNIST domain (60,000 train / 10,000 test) from the first folder with all four files."""
    looked: list[Path] = []
    for folder in fashion_mnist_dirs(ctx.root):
        found = {k: _find(folder, stem) for k, stem in FILES.items()}
        if all(found.values()):
            arr = {k: read_idx(p) for k, p in found.items()}  # type: ignore[arg-type]
            for split in ("train", "test"):
                x, y = arr[f"x_{split}"], arr[f"y_{split}"]
                if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
                    raise DatasetNotFoundError(f"{folder}: {split} images {x.shape} and labels {y.shape} do not match")
            return DomainData(to_uint8_chw(arr["x_train"]), torch.from_numpy(arr["y_train"].astype(np.int64)),
                              to_uint8_chw(arr["x_test"]), torch.from_numpy(arr["y_test"].astype(np.int64)),
                              note=str(folder))
        looked += [folder / f"{stem}[.gz]" for stem in FILES.values()]
    raise missing_dataset("fashion_mnist", domain, ctx.root, looked, FASHION_SRC, FASHION_LAYOUT)


register_dataset(DatasetSpec(
    name="fashion_mnist", domains=("fashion_mnist",), classes=FASHION_CLASSES, modality="image",
    loader=load_fashion_mnist, source=FASHION_SRC, layout=FASHION_LAYOUT, default_image_size=28,
))
