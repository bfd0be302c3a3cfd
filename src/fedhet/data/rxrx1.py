"""RxRx1 (WILDS version): fluorescence microscopy of cells under siRNA knock-downs, top-50 siRNAs, 4 cell types.

Expected layout (what `wilds.get_dataset("rxrx1", root_dir=<root>, download=True)` writes, version 1.0):

    <root>/rxrx1_v1.0/metadata.csv
    <root>/rxrx1_v1.0/images/<experiment>/Plate<plate>/<well>_s<site>.png

`metadata.csv` has (among others) the columns site_id, well_id, cell_type, dataset (train / val / test),
experiment, plate, well, site, well_type, sirna, sirna_id. The WILDS PNGs are 3-channel RGB versions of RxRx1's
6-channel 512x512 images (256x256 in WILDS 1.0; the Ditto-MMD paper also uses 3 channels: FL4Health stacks the
original w1-w3); they are read with `convert("RGB")` and resized (bilinear) to image_size (default 256).

Choices (docs/data.md):
- one domain per `cell_type` (HEPG2, HUVEC, RPE, U2OS), the client split of the Ditto-MMD paper's code
  (FL4Health `datasets/rxrx1/preprocess.py`): a feature shift between cell lines;
- classes: the 50 most frequent `sirna_id`s among the `dataset == "train"` rows of all cell types, ties broken
  by the smaller `sirna_id` (counts tie a lot: every siRNA appears once per experiment, controls once per
  plate); label k is the k-th smallest selected sirna_id. Rows of other siRNAs are dropped;
- split: train = `dataset == "train"` (both sites, i.e. WILDS' train + id_test), test = `dataset` in
  {val, test}. These are RxRx1's original train / test experiments, the split FL4Health takes from the
  original metadata's `dataset` column, so the test set holds unseen experimental batches of the same cell type.
"""

from __future__ import annotations

import csv
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fedhet.data.files import load_image, missing_dataset
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset
from fedhet.errors import DatasetNotFoundError

RXRX1_DOMAINS = ("HEPG2", "HUVEC", "RPE", "U2OS")
NUM_CLASSES = 50
RXRX1_CLASSES = tuple(f"top50_{k:02d}" for k in range(NUM_CLASSES))  # the sirna_ids are known only from the data
RXRX1_FOLDERS = ("rxrx1_v1.0", "rxrx1")
TRAIN_SPLITS = ("train",)
TEST_SPLITS = ("val", "test")
RXRX1_SRC = ("RxRx1 (Taylor et al., ICLR 2019 AI for Social Good workshop, https://www.rxrx.ai/rxrx1), WILDS "
             "version (Koh et al., ICML 2021, https://wilds.stanford.edu): pip install wilds; python -c \"import "
             "wilds; wilds.get_dataset('rxrx1', root_dir='<root>', download=True)\" (about 7.4 GB)")
RXRX1_LAYOUT = "rxrx1_v1.0/metadata.csv and rxrx1_v1.0/images/<experiment>/Plate<plate>/<well>_s<site>.png"
_COLUMNS = ("cell_type", "dataset", "experiment", "plate", "well", "site", "sirna_id")


@lru_cache(maxsize=4)
def _read_metadata(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, ...], ...]:
    """metadata.csv rows as tuples in `_COLUMNS` order (cached per file version)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise DatasetNotFoundError(f"{path} is not WILDS' RxRx1 metadata.csv: missing columns {', '.join(missing)}")
        return tuple(tuple(row[c] for c in _COLUMNS) for row in reader)


def read_metadata(path: Path) -> list[dict[str, str]]:
    """The rows of an RxRx1 metadata.csv (only the columns the loader uses)."""
    st = path.stat()
    return [dict(zip(_COLUMNS, r, strict=True)) for r in _read_metadata(str(path), st.st_mtime_ns, st.st_size)]


def top_sirnas(rows: list[dict[str, str]], k: int = NUM_CLASSES) -> list[int]:
    """The k most frequent sirna_ids among the training rows (ties: smaller id first), sorted ascending."""
    counts = Counter(int(r["sirna_id"]) for r in rows if r["dataset"] in TRAIN_SPLITS)
    if len(counts) < k:
        raise DatasetNotFoundError(f"RxRx1 metadata has only {len(counts)} siRNAs in its training rows, need {k}")
    ranked = sorted(counts, key=lambda s: (-counts[s], s))
    return sorted(ranked[:k])


def image_path(base: Path, row: dict[str, str]) -> Path:
    """WILDS' image file of a metadata row."""
    return base / "images" / row["experiment"] / f"Plate{int(float(row['plate']))}" / \
        f"{row['well']}_s{int(float(row['site']))}.png"


def _read(base: Path, rows: list[dict[str, str]], label: dict[int, int], size: int, domain: str
          ) -> tuple[torch.Tensor, torch.Tensor]:
    paths = [image_path(base, r) for r in rows]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"RxRx1 {domain}: {len(missing)} of the {len(paths)} images listed in metadata.csv are missing "
            f"(e.g. {missing[0]}); download the complete WILDS rxrx1 archive")
    x = np.stack([load_image(p, size) for p in paths]) if paths else np.zeros((0, size, size, 3), np.uint8)
    y = torch.tensor([label[int(r["sirna_id"])] for r in rows], dtype=torch.int64)
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), y


def load_rxrx1_domain(ctx: LoadContext, domain: str) -> DomainData:
    """One cell type of RxRx1 (WILDS layout), restricted to the 50 most frequent training siRNAs."""
    looked: list[Path] = []
    base = None
    if ctx.root is not None:
        for folder in RXRX1_FOLDERS:
            looked.append(ctx.root / folder / "metadata.csv")
            if (ctx.root / folder / "metadata.csv").is_file():
                base = ctx.root / folder
                break
    if base is None:
        raise missing_dataset("rxrx1", domain, ctx.root, looked, RXRX1_SRC, RXRX1_LAYOUT)
    rows = read_metadata(base / "metadata.csv")
    top = top_sirnas(rows)
    label = {s: i for i, s in enumerate(top)}
    mine = [r for r in rows if r["cell_type"] == domain and int(r["sirna_id"]) in label]
    train = [r for r in mine if r["dataset"] in TRAIN_SPLITS]
    test = [r for r in mine if r["dataset"] in TEST_SPLITS]
    if not train:
        raise DatasetNotFoundError(f"{base / 'metadata.csv'} has no training rows of cell type {domain} "
                                   "among the top-50 siRNAs")
    x, y = _read(base, train, label, ctx.image_size, domain)
    note = f"{base} (cell type {domain}; labels 0..49 = sirna_id {', '.join(map(str, top))})"
    if not test:
        return DomainData(x, y, note=note + "; no val/test rows, held-out split used")
    xt, yt = _read(base, test, label, ctx.image_size, domain)
    return DomainData(x, y, xt, yt, note=note)


register_dataset(DatasetSpec(
    name="rxrx1", domains=RXRX1_DOMAINS, classes=RXRX1_CLASSES, modality="image", loader=load_rxrx1_domain,
    source=RXRX1_SRC, layout=RXRX1_LAYOUT, default_image_size=256,
))
