"""Fed-ISIC2019 (FLamby): dermoscopy images from 6 centres, 8 classes; one domain per centre.

Expected layout (what FLamby's download + preprocessing scripts produce, plus FLamby's split file):

    <root>/fed_isic2019/ISIC_2019_Training_Input_preprocessed/<image>.jpg
    <root>/fed_isic2019/train_test_split          (or train_test_split.csv)

How to get it (FLamby, https://github.com/owkin/FLamby, `flamby/datasets/fed_isic2019/README.md`): accept the
ISIC 2019 and HAM10000 licences, then in `flamby/datasets/fed_isic2019/dataset_creation_scripts/` run
`python download_isic.py --output-folder <root>/fed_isic2019` and `python resize_images.py` (shorter side
224 px, aspect ratio kept, colour constancy). The split file ships with FLamby, not with the images: copy
`dataset_creation_scripts/train_test_split` into `<root>/fed_isic2019/`. When FLamby is installed
(`pip install -e` of its repository) and no copy is under the data root, the packaged file is used.

The split file is a CSV with the columns `image` (id without `.jpg`), the one-hot columns MEL..UNK, `target`
(0..7), `center` (0..5), `fold` (pooled split: train / test) and `fold2` (`train_<c>` / `test_<c>`). As FLamby's
`FedIsic2019(center=c, train=...)` does, a centre's official split is read from `fold2` (stratified by centre);
when a file has no `fold2`, `fold` is used. Centres (FLamby's `folds.py`): 0 BCN, 1 HAM_vidir_molemax,
2 HAM_vidir_modern, 3 HAM_rosendahl, 4 MSK, 5 HAM_vienna_dias.

The preprocessed images are rectangular (shorter side 224); each is centre-cropped to a square and resized
(bilinear) to image_size (default 200, FLamby's crop size) when loaded. The paper (and FLamby) report
balanced accuracy, which fedhet records for every client as `balanced_accuracy` (engine/local.evaluate).
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedhet.data.files import missing_dataset
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset
from fedhet.errors import DatasetNotFoundError

ISIC_CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")  # FLamby `target` 0..7
ISIC_CENTERS = ("BCN", "HAM_vidir_molemax", "HAM_vidir_modern", "HAM_rosendahl", "MSK", "HAM_vienna_dias")
ISIC_DOMAINS = tuple(f"center_{i}" for i in range(len(ISIC_CENTERS)))
ISIC_FOLDERS = ("fed_isic2019", "isic2019", "ISIC2019")
IMAGES_DIR = "ISIC_2019_Training_Input_preprocessed"
SPLIT_FILES = ("train_test_split", "train_test_split.csv")
ISIC_SRC = ("ISIC 2019 challenge (https://challenge.isic-archive.com/landing/2019/) + HAM10000 (Tschandl et al. "
            "2018); Fed-ISIC2019 of FLamby (Ogier du Terrail et al., NeurIPS 2022 Datasets and Benchmarks), "
            "https://github.com/owkin/FLamby: run its fed_isic2019/dataset_creation_scripts download_isic.py "
            "--output-folder <root>/fed_isic2019, then resize_images.py, and copy its train_test_split file there")
ISIC_LAYOUT = (f"fed_isic2019/{IMAGES_DIR}/<image>.jpg and fed_isic2019/train_test_split "
               "(FLamby's split CSV: image, target, center, fold, fold2)")


def _flamby_split_file() -> Path | None:
    """FLamby's packaged split file, when FLamby is installed (found without importing it)."""
    try:
        spec = importlib.util.find_spec("flamby")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "datasets" / "fed_isic2019" / "dataset_creation_scripts" / "train_test_split"
        if path.is_file():
            return path
    return None


def read_isic_split(path: Path, center: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(image id, target) rows of one centre's train and test split from FLamby's split CSV."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = set(reader.fieldnames or ())
        need = {"image", "target", "center"}
        if not need <= cols or not ({"fold", "fold2"} & cols):
            raise DatasetNotFoundError(
                f"{path} is not FLamby's Fed-ISIC2019 split file: expected the columns image, target, center and "
                f"fold2 (or fold); found {', '.join(sorted(cols)) or 'none'}")
        use_fold2 = "fold2" in cols
        train: list[tuple[str, int]] = []
        test: list[tuple[str, int]] = []
        for row in reader:
            if int(float(row["center"])) != center:
                continue
            target = int(float(row["target"]))
            if not 0 <= target < len(ISIC_CLASSES):
                raise DatasetNotFoundError(f"{path}: image {row['image']} has target {target}, expected 0..7")
            fold = row["fold2"].rsplit("_", 1)[0] if use_fold2 else row["fold"]
            if fold == "train":
                train.append((row["image"], target))
            elif fold == "test":
                test.append((row["image"], target))
            else:
                raise DatasetNotFoundError(f"{path}: image {row['image']} has fold '{fold}', expected train or test")
    return train, test


def load_square_image(path: Path, size: int) -> np.ndarray:
    """One image -> uint8 size x size x 3: centre crop to a square, then bilinear resize."""
    with Image.open(path) as file:
        img = file.convert("RGB")
        w, h = img.size
        s = min(w, h)
        left, top = (w - s) // 2, (h - s) // 2
        img = img.crop((left, top, left + s, top + s))
        if img.size != (size, size):
            img = img.resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(img, dtype=np.uint8)


def _read_images(images: Path, rows: list[tuple[str, int]], size: int, domain: str
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    paths = [images / f"{name}.jpg" for name, _ in rows]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"Fed-ISIC2019 {domain}: {len(missing)} of the {len(paths)} images listed in the split file are missing "
            f"from {images} (e.g. {', '.join(p.name for p in missing[:3])}); run FLamby's download_isic.py and "
            "resize_images.py for the whole dataset")
    x = np.stack([load_square_image(p, size) for p in paths]) if paths else np.zeros((0, size, size, 3), np.uint8)
    y = torch.tensor([t for _, t in rows], dtype=torch.int64)
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), y


def load_isic_domain(ctx: LoadContext, domain: str) -> DomainData:
    """One Fed-ISIC2019 centre (`center_<k>`) with FLamby's official train/test split."""
    center = ISIC_DOMAINS.index(domain)
    looked: list[Path | str] = []
    base = None
    if ctx.root is not None:
        for folder in ISIC_FOLDERS:
            looked.append(ctx.root / folder / IMAGES_DIR)
            if (ctx.root / folder / IMAGES_DIR).is_dir():
                base = ctx.root / folder
                break
    split = None
    if base is not None:
        cands = [base / n for n in SPLIT_FILES]
        looked += cands
        split = next((p for p in cands if p.is_file()), None)
        if split is None:
            split = _flamby_split_file()
            looked.append("FLamby's packaged dataset_creation_scripts/train_test_split (FLamby not installed)")
    if base is None or split is None:
        raise missing_dataset("isic2019", domain, ctx.root, looked, ISIC_SRC, ISIC_LAYOUT)
    train, test = read_isic_split(split, center)
    if not train:
        raise DatasetNotFoundError(f"{split} lists no training image of center {center} ({ISIC_CENTERS[center]})")
    images = base / IMAGES_DIR
    x, y = _read_images(images, train, ctx.image_size, domain)
    note = f"{images} ({ISIC_CENTERS[center]}; split {split})"
    if not test:
        return DomainData(x, y, note=note)
    xt, yt = _read_images(images, test, ctx.image_size, domain)
    return DomainData(x, y, xt, yt, note=note)


register_dataset(DatasetSpec(
    name="isic2019", domains=ISIC_DOMAINS, classes=ISIC_CLASSES, modality="image", loader=load_isic_domain,
    source=ISIC_SRC, layout=ISIC_LAYOUT, default_image_size=200,
))
