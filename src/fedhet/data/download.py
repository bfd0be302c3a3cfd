"""Downloads behind `data.download: true`: fetch a dataset once and convert it into the loaders' own layout.

Nothing here runs unless a loader finds its files missing and `data.download` is true. Every dataset is
converted once, atomically, into the layout its loader reads, so later runs read from disk: `materialize` is the
one writer (an npz per domain, or image folders; each written to a temporary that is moved into place when
complete, so an interrupted download leaves nothing a loader would read), fed by `torchvision_digits` (MNIST /
USPS, downloaded to a temporary folder deleted after the conversion) or `hf_samples` (a Hugging Face hub dataset,
Flower Datasets' `flwrlabs/...` copies, needing the optional package `datasets`).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fedhet.atomic import atomic_write
from fedhet.errors import DatasetNotFoundError

Sample = tuple[Any, ...]  # Any: (domain, class_name, image) or (domain, class_name, image, split); image: PIL or array

_IMAGE_COLUMNS = ("image", "img", "picture", "photo")
_LABEL_COLUMNS = ("label", "labels", "category", "class", "class_name", "target")
_DOMAIN_COLUMNS = ("domain", "domains", "style", "environment")


def norm_name(name: object) -> str:
    """A class or domain name compared case-insensitively, spaces and dashes as underscores."""
    return str(name).strip().lower().replace(" ", "_").replace("-", "_")


def need_root(dataset: str, domain: str, what: str) -> DatasetNotFoundError:
    """The error for `data.download: true` without a data root (there is nowhere to put the files)."""
    return DatasetNotFoundError(
        f"dataset '{dataset}', domain '{domain}' is not on disk and data.download is true, but no data root is "
        f"set, so there is nowhere to put the download ({what}). Set the environment variable FEDHET_DATA or "
        f"the config value data.root to a writable folder.")


# ----------------------------------------------------------------------------------------------- writing


def write_npz_atomic(path: Path, **arrays: np.ndarray) -> Path:
    """`np.savez` to a temporary file beside `path`, then moved into place atomically (no partial npz)."""

    named: dict[str, Any] = dict(arrays)  # Any: numpy's stub would check each value against savez's allow_pickle: bool

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **named)

    return atomic_write(path, write)


def _numpy(data: Any) -> np.ndarray:  # Any: a tensor, an array or a list
    return data.numpy() if hasattr(data, "numpy") else np.asarray(data)


def _decoded(image: Any) -> Image.Image:  # Any: a PIL image, an HF image record, an array or a tensor
    """`image` as a PIL image in mode L or RGB."""
    if isinstance(image, dict):
        image = _open_encoded(image)
    pil = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(_numpy(image), dtype=np.uint8))
    return pil if pil.mode in ("L", "RGB") else pil.convert("RGB")


def _image_array(image: Any) -> np.ndarray:  # Any: as _decoded's
    """A PIL image or HF `{"bytes", "path"}` dict (decoded, L or RGB), array or tensor as a uint8 array."""
    return np.asarray(_decoded(image) if isinstance(image, (dict, Image.Image)) else _numpy(image), dtype=np.uint8)


def _open_encoded(image: dict[str, Any]) -> Image.Image:  # Any: an HF image record
    if image.get("bytes") is not None:
        img = Image.open(io.BytesIO(image["bytes"]))
    elif image.get("path"):
        img = Image.open(image["path"])
    else:
        raise ValueError("image record has neither bytes nor path")
    img.load()
    return img


def _write_image(image: Any, stem: Path) -> None:  # Any: a PIL image or an array
    """One image file `stem.<ext>`: encoded bytes are written as they are (no re-encoding), decoded images as PNG."""
    if isinstance(image, dict) and image.get("bytes") is not None:
        data = image["bytes"]
        ext = Path(str(image.get("path") or "")).suffix.lower()
        if ext not in (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"):
            with Image.open(io.BytesIO(data)) as img:
                ext = "." + (img.format or "png").lower().replace("jpeg", "jpg")
        stem.with_suffix(ext).write_bytes(data)
        return
    _decoded(image).save(stem.with_suffix(".png"))


def materialize(samples: Iterable[Sample], dest: Path, classes: Sequence[str], fmt: str,
                domains: Collection[str] | None = None) -> dict[str, Path]:
    """Write `(domain, class_name, image[, split])` samples into the loader layout under `dest`.

    fmt "npz": one `dest/<domain>.npz` per domain (x uint8, y int64 index into `classes`, `split` when the
    samples carry one); fmt "folder": `dest/<domain>/<class>/<n>.<ext>` with the canonical class names of
    `classes`. Class names match case-insensitively (spaces/dashes = underscores); samples of other classes,
    or of domains not in `domains` (when given), are skipped. Existing domain folders are never overwritten.
    Returns the paths written, by domain.
    """
    if fmt not in ("npz", "folder"):
        raise ValueError(f"fmt must be 'npz' or 'folder', got {fmt!r}")
    label_of = {norm_name(c): i for i, c in enumerate(classes)}
    wanted = None if domains is None else set(domains)
    dest.mkdir(parents=True, exist_ok=True)
    tmp_dirs: dict[str, Path] = {}
    counts: dict[str, int] = {}
    arrays: dict[str, tuple[list[np.ndarray], list[int], list[int]]] = {}
    try:
        for sample in samples:
            domain, cls, image = sample[0], sample[1], sample[2]
            label = label_of.get(norm_name(cls))
            if label is None or (wanted is not None and domain not in wanted):
                continue
            if fmt == "npz":
                xs, ys, ss = arrays.setdefault(domain, ([], [], []))
                xs.append(_image_array(image))
                ys.append(label)
                ss.append(int(sample[3]) if len(sample) > 3 else 0)
                continue
            if domain not in tmp_dirs:
                tmp_dirs[domain] = Path(tempfile.mkdtemp(dir=dest, prefix=f".{domain}.", suffix=".tmp"))
            n = counts[domain] = counts.get(domain, 0) + 1
            cls_dir = tmp_dirs[domain] / classes[label]
            cls_dir.mkdir(exist_ok=True)
            _write_image(image, cls_dir / f"{n:06d}")
        return _write_npz_domains(arrays, dest) if fmt == "npz" else _move_folders(tmp_dirs, dest)
    finally:
        for tmp in tmp_dirs.values():
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _write_npz_domains(arrays: dict[str, tuple[list[np.ndarray], list[int], list[int]]],
                       dest: Path) -> dict[str, Path]:
    """`dest/<domain>.npz` (x, y, and `split` when any sample has one) per domain of (images, labels, splits)."""
    written: dict[str, Path] = {}
    for domain, (xs, ys, ss) in arrays.items():
        shapes = {x.shape for x in xs}
        if len(shapes) > 1:
            raise ValueError(f"domain '{domain}': images differ in shape ({sorted(shapes)[:3]}...); "
                             "the npz layout needs one shape")
        out = {"x": np.stack(xs), "y": np.asarray(ys, dtype=np.int64)}
        if any(ss):
            out["split"] = np.asarray(ss, dtype=np.int8)
        written[domain] = write_npz_atomic(dest / f"{domain}.npz", **out)
    return written


def _move_folders(tmp_dirs: dict[str, Path], dest: Path) -> dict[str, Path]:
    """Move each domain's temporary folder to `dest/<domain>`; a folder that is already there is kept."""
    written: dict[str, Path] = {}
    for domain, tmp in tmp_dirs.items():
        final = dest / domain
        try:
            os.replace(tmp, final)  # atomic; fails when `final` exists and is not empty
        except OSError:
            if not final.is_dir():
                raise
            continue  # someone else put it there first: keep theirs (the temp folder is removed by the caller)
        written[domain] = final
    return written


# ----------------------------------------------------------------------------------------------- sources


def torchvision_digits(name: str, domain: str, download_dir: Path) -> Iterator[Sample]:
    """Samples `(domain, "0".."9", HxW uint8, split)` of torchvision's MNIST or USPS (train then test)."""
    import torchvision.datasets as tvd

    cls = {"mnist": "MNIST", "usps": "USPS"}[name]
    for split, train in ((0, True), (1, False)):
        ds = getattr(tvd, cls)(str(download_dir), train=train, download=True)
        for x, y in zip(_numpy(ds.data), _numpy(ds.targets), strict=True):
            yield domain, str(int(y)), x, split


def download_torchvision_digits(name: str, npz: Path) -> Path:
    """Download MNIST or USPS with torchvision and convert it once into `npz` (x NxHxW uint8, y, split)."""
    npz.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=npz.parent, prefix=f".{name}-download.") as tmp:
        written = materialize(torchvision_digits(name, npz.stem, Path(tmp)), npz.parent,
                              [str(i) for i in range(10)], "npz", domains=[npz.stem])
    if npz.stem not in written:
        raise DatasetNotFoundError(f"torchvision's {name.upper()} gave no samples; nothing written to {npz}")
    return written[npz.stem]


def _import_hf_datasets(dataset: str, domain: str, repo: str) -> Any:  # Any: the untyped HF `datasets` module
    try:
        import datasets as hf_datasets
    except ImportError as e:
        raise DatasetNotFoundError(
            f"dataset '{dataset}', domain '{domain}' is not on disk; data.download is true, and it would be "
            f"fetched from the Hugging Face hub ({repo}), which needs the optional package `datasets`, which is "
            f"not installed. Run: pip install datasets  (or put the files in place by hand, see below)\n({e})"
        ) from e
    if not hasattr(hf_datasets, "load_dataset"):
        raise DatasetNotFoundError(f"the installed module `datasets` ({getattr(hf_datasets, '__file__', '?')}) is "
                                   "not Hugging Face datasets; run: pip install datasets")
    return hf_datasets


def _pick(columns: Sequence[str], features: Any,  # Any: an HF split's features (untyped)
          kind: str | None, names: Sequence[str]) -> str | None:
    """The column whose feature is a `kind` (HF's type name, e.g. Image), else the first named one of `names`."""
    typed = next((c for c in columns if type(features.get(c)).__name__ == kind), None) if kind else None
    lower = {c.lower(): c for c in columns}
    return typed or next((lower[c] for c in names if c in lower), None)


def _columns(split_ds: Any) -> tuple[str, str, str | None, Callable[[Any], str]]:  # Any: HF datasets (untyped)
    """(image column, label column, domain column or None, label -> class name) of one HF split."""
    features = getattr(split_ds, "features", None) or {}
    columns = list(getattr(split_ds, "column_names", None) or features.keys())
    image_col = _pick(columns, features, "Image", _IMAGE_COLUMNS)
    label_col = _pick(columns, features, "ClassLabel", _LABEL_COLUMNS)
    domain_col = _pick(columns, features, None, _DOMAIN_COLUMNS)
    if image_col is None or label_col is None:
        raise DatasetNotFoundError(f"cannot find the image and label columns of the hub dataset (columns: {columns})")
    names = getattr(features.get(label_col), "names", None)

    def class_name(value: Any) -> str:  # Any: an HF label value
        if names is not None and isinstance(value, (int, np.integer)):
            return str(names[int(value)])
        return str(value)

    return image_col, label_col, domain_col, class_name


def hf_samples(hf_datasets: Any, repo: str,  # Any: the untyped HF `datasets` module
               domains: Sequence[str], classes: Sequence[str],
               **load_kwargs: Any) -> Iterator[Sample]:  # Any: forwarded to load_dataset
    """Samples `(domain, class_name, image)` of hub dataset `repo`, all splits, for the given domains/classes.

    The domain comes from a `domain` column (values such as "Real World" map to "Real_World"), else from a
    split named after a domain. Images are read undecoded when possible (the original file bytes), and rows
    of other domains or classes are dropped before any image is read when the dataset allows it.
    """
    dom_of = {norm_name(d): d for d in domains}
    wanted_cls = {norm_name(c) for c in classes}
    loaded = hf_datasets.load_dataset(repo, **load_kwargs)
    splits = list(loaded.items()) if hasattr(loaded, "items") else [("train", loaded)]
    for split_name, ds in splits:
        image_col, label_col, domain_col, class_name = _columns(ds)
        split_domain = dom_of.get(norm_name(split_name))
        if domain_col is None and split_domain is None:
            raise DatasetNotFoundError(f"hub dataset {repo}: split '{split_name}' has no domain column "
                                       f"(columns: {list(getattr(ds, 'column_names', []))})")
        try:  # keep the original encoded bytes instead of decoding every image
            ds = ds.cast_column(image_col, hf_datasets.Image(decode=False))
        except Exception:  # older/other dataset objects: decoded images are fine too
            pass
        try:  # select wanted rows from the label/domain columns alone
            labels = ds[label_col]
            doms = ds[domain_col] if domain_col is not None else [split_name] * len(labels)
            keep = [i for i, (lab, dom) in enumerate(zip(labels, doms, strict=True))
                    if norm_name(class_name(lab)) in wanted_cls and norm_name(dom) in dom_of]
            ds = ds.select(keep)
        except Exception:  # fall back to filtering row by row
            pass
        for row in ds:
            dom = dom_of.get(norm_name(row[domain_col])) if domain_col is not None else split_domain
            if dom is not None:
                yield dom, class_name(row[label_col]), row[image_col]


def download_hf_image_folders(dataset: str, repo: str, dest: Path, domains: Sequence[str],
                              classes: Sequence[str]) -> dict[str, Path]:
    """Fetch hub dataset `repo` and write the folders `dest/<domain>/<class>/*` of `domains` in one pass.

    `domains[0]` is the domain asked for (named in errors); pass only domains not yet on disk.
    """
    hf_datasets = _import_hf_datasets(dataset, domains[0], repo)
    return materialize(hf_samples(hf_datasets, repo, domains, classes), dest, classes, "folder", domains=domains)
