"""CIFAR-10 (Krizhevsky 2009) from its python release: one domain, 10 classes, 32x32 colour, official split.

Looked for under the data root, in this order:

    <root>/cifar10/cifar-10-batches-py/{data_batch_1, ..., data_batch_5, test_batch}   (torchvision's layout)
    <root>/cifar-10-batches-py/...
    <root>/cifar10/cifar10.npz   (x uint8 NxHxWx3, y int64, split 0 train / 1 test), fedhet's own npz form

With `data.download: true` (and a data root) a missing copy is fetched once by torchvision.datasets.CIFAR10
into `<root>/cifar10/`. It is a single domain meant for label-skew partitions (`data.partition: dirichlet`),
e.g. the CIFAR-10 setting of Ditto + MMD (configs/ditto_mmd/cifar10.yaml).

The batches are Python pickles (the format of the official release, as torchvision reads it). They are read
with an unpickler that builds numpy arrays and plain containers only (`BatchUnpickler`), so a crafted batch
cannot run code. A batch that is not such a pickle with `data` (N x 3072 uint8, R, G, B planes row-major) and
`labels` (N ints in 0..9) is a DatasetNotFoundError that names the file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.data.download import need_root
from fedhet.data.files import missing_dataset, read_image_npz, to_uint8_chw
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset
from fedhet.errors import DatasetNotFoundError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
BATCH_FOLDER = "cifar-10-batches-py"
CIFAR10_SRC = ("Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html ('CIFAR-10 python version', "
               "extract cifar-10-python.tar.gz; or torchvision.datasets.CIFAR10; or data.download=true)")
CIFAR10_LAYOUT = f"cifar10/{BATCH_FOLDER}/{{data_batch_1..5, test_batch}} (or cifar10/cifar10.npz: x, y, split)"


class BatchUnpickler(pickle.Unpickler):
    """An unpickler for the CIFAR-10 batches: numpy's array reconstruction (and `_codecs.encode`, which protocol 2
    uses for bytes) and nothing else can be named."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:  # Any: pickle.Unpickler's signature
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing {module}.{name}: a CIFAR-10 batch holds numpy arrays only")
        return super().find_class(module, name)


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch as (images N x 32 x 32 x 3 uint8, labels N int64); clear error on a corrupt file."""
    try:
        with open(path, "rb") as f:
            batch = BatchUnpickler(f, encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise DatasetNotFoundError(
            f"{path} is not a readable CIFAR-10 batch ({type(e).__name__}: {e}); re-extract cifar-10-python.tar.gz"
        ) from e
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise DatasetNotFoundError(f"{path}: data {data.shape} / labels {labels.shape}, expected N x 3072 and N")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CIFAR10_CLASSES)):
        raise DatasetNotFoundError(f"{path}: labels outside 0..9 (not CIFAR-10?)")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _read_batches(folder: Path) -> DomainData:
    train = [read_cifar_batch(folder / name) for name in TRAIN_BATCHES]
    xt, yt = read_cifar_batch(folder / TEST_BATCH)
    x, y = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    return DomainData(to_uint8_chw(x), torch.from_numpy(y), to_uint8_chw(xt), torch.from_numpy(yt), note=str(folder))


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in (*TRAIN_BATCHES, TEST_BATCH))


def load_cifar10(ctx: LoadContext, domain: str) -> DomainData:
    """The single CIFAR-10 domain (50,000 train / 10,000 test) from the first layout found under the root."""
    if ctx.root is None:
        if ctx.download:
            raise need_root("cifar10", domain, "torchvision.datasets.CIFAR10")
        raise missing_dataset("cifar10", domain, None, [], CIFAR10_SRC, CIFAR10_LAYOUT)
    folders = [ctx.root / "cifar10" / BATCH_FOLDER, ctx.root / BATCH_FOLDER]
    npz = ctx.root / "cifar10" / "cifar10.npz"
    for folder in folders:
        if _complete(folder):
            return _read_batches(folder)
    if npz.is_file():
        return read_image_npz(npz)
    if ctx.download:
        from torchvision.datasets import CIFAR10

        (ctx.root / "cifar10").mkdir(parents=True, exist_ok=True)
        for train in (True, False):  # torchvision verifies the archive's md5 and extracts it
            CIFAR10(str(ctx.root / "cifar10"), train=train, download=True)
        return _read_batches(folders[0])
    looked = [f / f"{{{', '.join((*TRAIN_BATCHES, TEST_BATCH))}}}" for f in folders] + [npz]
    raise missing_dataset("cifar10", domain, ctx.root, looked, CIFAR10_SRC, CIFAR10_LAYOUT)


register_dataset(DatasetSpec(
    name="cifar10", domains=("cifar10",), classes=CIFAR10_CLASSES, modality="image",
    loader=load_cifar10, source=CIFAR10_SRC, layout=CIFAR10_LAYOUT, default_image_size=32,
))
