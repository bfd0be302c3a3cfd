"""Reading domain data from disk (npz arrays, image folders) and the missing-dataset error.

Image folders: hidden files and folders (names starting with '.', e.g. .DS_Store), Thumbs.db and desktop.ini
are skipped; any other non-image file, a sub-folder inside a class folder, an empty class folder and a corrupt
or truncated image are each a DataFileError naming the path.
"""

from __future__ import annotations

import logging
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from fedhet.data.registry import DomainData
from fedhet.errors import DatasetNotFoundError, FedhetError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
JUNK_FILES = frozenset({"thumbs.db", "desktop.ini"})  # besides hidden names (starting with '.')
log = logging.getLogger(__name__)


class DataFileError(FedhetError):
    """A data file or folder is present but unusable (not an image, corrupt, empty); the message names it."""


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


@contextmanager
def open_npz(path: Path) -> Iterator[Any]:  # Any: np.load's NpzFile (untyped)
    """`np.load` of a dataset .npz; a truncated or corrupt file or a missing array (also when read inside the
    `with` block) is a DataFileError naming the file and the fix, not a bare BadZipFile / KeyError."""
    fix = "delete it and convert / download the dataset again (see `fedhet data list`)"
    try:
        with np.load(path, allow_pickle=False) as z:
            yield z
    except KeyError as err:
        name = str(err.args[0] if err.args else err).split(" is not a file")[0]
        raise DataFileError(f"dataset file '{path}' lacks the array '{name}': {fix}") from err
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        reason = getattr(err, "strerror", None) or (str(err).splitlines() or [type(err).__name__])[0]
        reason = "not a NumPy .npz archive" if "pickle" in reason else reason
        raise DataFileError(f"dataset file '{path}' cannot be read ({reason}): it is truncated or corrupt; "
                            f"{fix}") from err


def read_image_npz(path: Path, use_split: bool = True) -> DomainData:
    """An image npz (`x`, `y`, optional `split` 0=train 1=test) as DomainData.

    When the file also holds `x_native` (the source's own resolution, e.g. MNIST 28x28 or USPS 16x16 beside an
    upsampled `x`), that is read instead, so the transform resizes each image once, from its native size.
    """
    with open_npz(path) as z:
        x = to_uint8_chw(z["x_native" if "x_native" in z.files else "x"])
        y = torch.from_numpy(z["y"].astype(np.int64))
        split = z["split"] if (use_split and "split" in z.files) else None
    note = str(path)
    if split is None or not (split == 1).any():
        return DomainData(x, y, note=note)
    tr, te = torch.from_numpy(split == 0), torch.from_numpy(split == 1)
    return DomainData(x[tr], y[tr], x[te], y[te], note=note)


def load_image(path: Path, size: int, mode: str = "RGB") -> np.ndarray:
    """One image file -> uint8 size x size x 3 (mode RGB) or size x size (mode L); bilinear resize of the whole
    image, no crop. An unreadable, corrupt or truncated file is a DataFileError naming it."""
    try:
        with Image.open(path) as img:
            out = img.convert(mode)  # decodes the whole file: a truncated one fails here
        if out.size != (size, size):
            out = out.resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(out, dtype=np.uint8)
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as err:  # PIL's read errors
        raise DataFileError(f"image '{path}' cannot be read ({type(err).__name__}: {err}): it is corrupt, "
                            "truncated or not an image; replace it or delete it") from err


def is_junk(path: Path) -> bool:
    """Files and folders skipped in image folders: hidden names (.DS_Store, ._x, .ipynb_checkpoints), Thumbs.db,
    desktop.ini."""
    return path.name.startswith(".") or path.name.lower() in JUNK_FILES


def image_files(class_dir: Path) -> list[Path]:
    """The image files of a class folder, sorted by name. Junk (`is_junk`) is skipped; any other file without an
    image extension, or a sub-folder, is a DataFileError naming it (nothing is dropped without a word)."""
    files = []
    for f in sorted(class_dir.iterdir()):
        if is_junk(f):
            continue
        if f.is_dir():
            raise DataFileError(f"'{f}' is a folder inside class folder '{class_dir}'; a class folder holds image "
                                "files only: move its images up or move the folder out")
        if f.suffix.lower() not in IMAGE_EXTENSIONS:
            raise DataFileError(f"'{f}' in class folder '{class_dir}' is not an image (extensions read: "
                                f"{', '.join(IMAGE_EXTENSIONS)}); move it out of the class folder")
        files.append(f)
    return files


def empty_class_folder(folder: Path) -> DataFileError:
    """The error for a class folder without images."""
    return DataFileError(f"class folder '{folder}' holds no images: add its images, or delete the folder if this "
                         "domain really has no such samples")


def read_images(files: Sequence[Path], size: int, channels: int = 3) -> torch.Tensor:
    """Image files -> uint8 N x channels x size x size (channels 1: grey, 3: RGB)."""
    mode = {1: "L", 3: "RGB"}[channels]
    if not files:
        return torch.zeros((0, channels, size, size), dtype=torch.uint8)
    x = np.stack([load_image(f, size, mode) for f in files])
    x = x[:, None] if channels == 1 else x.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(x))


def find_class_dirs(domain_dir: Path) -> dict[str, Path]:
    """Class folders of a domain folder keyed by lower-case name (an intermediate `images/` folder is allowed)."""
    base = domain_dir / "images" if (domain_dir / "images").is_dir() else domain_dir
    return {p.name.lower().replace(" ", "_"): p for p in sorted(base.iterdir()) if p.is_dir() and not is_junk(p)}


def read_image_folder(domain_dir: Path, classes: Sequence[str], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All images of `domain_dir/<class>/*` for the given classes (case-insensitive; other folders ignored).

    Images are resized to size x size at load time so the domain fits in memory as uint8 tensors. An empty class
    folder, a non-image file or a corrupt image is a DataFileError naming it; classes without a folder are
    logged as a warning (the domain's clients will not see them).
    """
    dirs = find_class_dirs(domain_dir)
    files: list[Path] = []
    ys: list[int] = []
    absent = []
    for label, cls in enumerate(classes):
        d = dirs.get(cls.lower().replace(" ", "_"))
        if d is None:
            absent.append(cls)
            continue
        found = image_files(d)
        if not found:
            raise empty_class_folder(d)
        files += found
        ys += [label] * len(found)
    if not files:
        raise DatasetNotFoundError(
            f"no images of the expected classes in '{domain_dir}'; expected class folders such as "
            f"{', '.join(list(classes)[:5])} holding .jpg/.png files")
    if absent:
        log.warning("'%s' has no folder for %d of %d classes (%s): its clients will not see them", domain_dir,
                    len(absent), len(classes), ", ".join(absent[:10]) + (", ..." if len(absent) > 10 else ""))
    return read_images(files, size), torch.tensor(ys, dtype=torch.int64)
