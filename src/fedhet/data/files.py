"""Reading domain data from disk (npz arrays, image folders) and the missing-dataset error."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedhet.data.registry import DomainData
from fedhet.errors import DatasetNotFoundError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def missing_dataset(dataset: str, domain: str, root: Path | None, looked_for: Sequence[Path | str],
                    source: str, layout: str) -> DatasetNotFoundError:
    """An error naming what was looked for, where to get the data and where to put it."""
    if root is None:
        where = ("no data root is set: set the environment variable FEDHET_DATA or the config value "
                 "data.root to the folder that holds your datasets")
    else:
        where = f"data root is '{root}' (from data.root or FEDHET_DATA)"
    looked = "\n".join(f"  - {p}" for p in looked_for) if looked_for else "  (nothing: no data root)"
    return DatasetNotFoundError(
        f"dataset '{dataset}', domain '{domain}' not found; {where}.\n"
        f"Looked for:\n{looked}\n"
        f"Get it from: {source}\n"
        f"Put it at: <root>/{layout} (where <root> is FEDHET_DATA or data.root)"
    )


def to_uint8_chw(x: np.ndarray) -> torch.Tensor:
    """NxHxW or NxHxWxC (C in 1, 3, 4) uint8-like array -> uint8 Nx3xHxW tensor (grey repeated, alpha dropped)."""
    x = np.asarray(x)
    if x.dtype != np.uint8:
        if np.issubdtype(x.dtype, np.floating) and x.size and float(x.max()) <= 1.0:
            x = x * 255.0
        x = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise ValueError(f"expected images NxHxW or NxHxWxC, got shape {x.shape}")
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    elif x.shape[-1] == 4:
        x = x[..., :3]
    elif x.shape[-1] != 3:
        raise ValueError(f"expected 1, 3 or 4 channels last, got shape {x.shape}")
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def read_image_npz(path: Path, use_split: bool = True) -> DomainData:
    """An image npz (`x`, `y`, optional `split` 0=train 1=test) as DomainData.

    When the file also holds `x_native` (the source's own resolution, e.g. MNIST 28x28 or USPS 16x16 beside an
    upsampled `x`), that is read instead, so the transform resizes each image once, from its native size.
    """
    with np.load(path) as z:
        x = to_uint8_chw(z["x_native" if "x_native" in z.files else "x"])
        y = torch.from_numpy(z["y"].astype(np.int64))
        split = z["split"] if (use_split and "split" in z.files) else None
    note = str(path)
    if split is None or not (split == 1).any():
        return DomainData(x, y, note=note)
    tr, te = torch.from_numpy(split == 0), torch.from_numpy(split == 1)
    return DomainData(x[tr], y[tr], x[te], y[te], note=note)


def load_image(path: Path, size: int) -> np.ndarray:
    """One image file -> uint8 size x size x 3 (bilinear resize of the whole image, no crop)."""
    with Image.open(path) as img:
        img = img.convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8)


def find_class_dirs(domain_dir: Path) -> dict[str, Path]:
    """Class folders of a domain folder keyed by lower-case name (an intermediate `images/` folder is allowed)."""
    base = domain_dir / "images" if (domain_dir / "images").is_dir() else domain_dir
    return {p.name.lower().replace(" ", "_"): p for p in sorted(base.iterdir()) if p.is_dir()}


def read_image_folder(domain_dir: Path, classes: Sequence[str], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All images of `domain_dir/<class>/*` for the given classes (case-insensitive; other folders ignored).

    Images are resized to size x size at load time so the domain fits in memory as uint8 tensors.
    """
    dirs = find_class_dirs(domain_dir)
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for label, cls in enumerate(classes):
        d = dirs.get(cls.lower().replace(" ", "_"))
        if d is None:
            continue
        for f in sorted(d.iterdir()):
            if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file():
                xs.append(load_image(f, size))
                ys.append(label)
    if not xs:
        raise DatasetNotFoundError(
            f"no images of the expected classes in '{domain_dir}'; expected class folders such as "
            f"{', '.join(list(classes)[:5])} holding .jpg/.png files")
    x = torch.from_numpy(np.stack(xs).transpose(0, 3, 1, 2).copy())
    return x, torch.tensor(ys, dtype=torch.int64)
