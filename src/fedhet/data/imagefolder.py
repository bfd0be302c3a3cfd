"""`imagefolder`: your own feature-shift images, one folder per domain under `data.root`.

Layouts, per domain (detected, or forced with `data.options.layout`):
- split: `<root>/<domain>/{train,test}/<class>/*.png`: the given train / test split;
- flat: `<root>/<domain>/<class>/*.png`: a seeded stratified `data.test_fraction` hold-out per domain.
Domains are the sub-folders of `data.root` (sorted; `data.domains` picks some); classes are the union of the
class folders of the chosen domains (sorted), and every chosen domain (and split) must hold every class, else
an error names the class and the domain, unless `data.options.allow_missing_classes: true`. Images are read
as grey (channels 1) or RGB (channels 3) and resized to image_size x image_size when loaded. Normalisation:
ImageNet statistics (default), statistics fitted on each client's training split (`normalize: client`), given
ones (`normalize: fixed` with mean / std) or none. See docs/data.md "Bring your own data".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torchvision.transforms import v2

from fedhet.data.files import DataFileError, image_files, is_junk, read_images
from fedhet.data.registry import (
    DatasetSpec,
    DomainData,
    LoadContext,
    Loader,
    Transform,
    TransformFactory,
    register_dataset,
    resolve_domains,
)
from fedhet.data.transforms import IMAGENET_MEAN, IMAGENET_STD, AddGaussianNoise
from fedhet.errors import ConfigError, DatasetNotFoundError, nearest

if TYPE_CHECKING:
    from fedhet.config import DataConfig
    from fedhet.data.datasets import IndexedDataset

log = logging.getLogger(__name__)
NORMALIZE = ("imagenet", "client", "fixed", "none")
LAYOUTS = ("auto", "split", "flat")
SPLITS = ("train", "test")
IMAGENET_GREY = ((0.449,), (0.226,))  # the means of ImageNet's channel statistics, for channels: 1


@dataclass
class ImageFolderOptions:
    """`data.options` of dataset `imagefolder`."""

    channels: int = 3  # 1 (images converted to grey) or 3 (RGB)
    normalize: str = "imagenet"  # imagenet | client (fitted on each client's training split) | fixed | none
    mean: list[float] | None = None  # normalize: fixed only, one value per channel (images scaled to [0, 1])
    std: list[float] | None = None  # normalize: fixed only, one value per channel
    layout: str = "auto"  # auto | split (<domain>/{train,test}/<class>/) | flat (<domain>/<class>/)
    allow_missing_classes: bool = False  # let a domain lack classes the others have (else an error)
    hflip: bool = True  # random horizontal flips in training augmentation (false when a flip changes the label)

    def validate(self) -> None:
        where = "data.options"
        if self.channels not in (1, 3):
            raise ConfigError(f"{where}.channels must be 1 (grey) or 3 (RGB), got {self.channels}")
        for key, name, choices in (("normalize", self.normalize, NORMALIZE), ("layout", self.layout, LAYOUTS)):
            if name not in choices:
                raise ConfigError(f"{where}.{key} must be one of {', '.join(choices)}{nearest(name, choices)}, "
                                  f"got '{name}'")
        if self.normalize != "fixed":
            if self.mean is not None or self.std is not None:
                raise ConfigError(f"{where}.mean / std are used only with normalize: fixed (normalize is "
                                  f"'{self.normalize}'); set normalize: fixed or remove them")
            return
        for key, value in (("mean", self.mean), ("std", self.std)):
            if value is None or len(value) != self.channels:
                raise ConfigError(f"{where}.{key} must list {self.channels} value(s) (one per channel) with "
                                  f"normalize: fixed, got {value}")
        if not all(s > 0 for s in self.std or ()):
            raise ConfigError(f"{where}.std must be > 0, got {self.std}")


Scan = dict[str, dict[str, dict[str, list[Path]]]]  # domain -> split ("all" when flat) -> class -> image files


def _layout(domain_dir: Path, wanted: str) -> str:
    """'split' or 'flat' for one domain folder."""
    subdirs = sorted(p.name for p in domain_dir.iterdir() if p.is_dir() and not is_junk(p))
    has = [s for s in SPLITS if s in subdirs]
    if wanted == "flat" or (wanted == "auto" and not has):
        return "flat"
    if has == list(SPLITS) and len(subdirs) == 2:
        return "split"
    others = [s for s in subdirs if s not in SPLITS]
    raise DataFileError(
        f"domain folder '{domain_dir}' holds {', '.join(subdirs) or 'no folders'}: the split layout is "
        f"<domain>/train/<class>/ and <domain>/test/<class>/ and nothing else"
        + (f" (move {', '.join(others)} out)" if others and has else "")
        + "; or set data.options.layout: flat if train / test are class names")


def _scan_domain(domain_dir: Path, layout: str, allow_missing: bool) -> dict[str, dict[str, list[Path]]]:
    out: dict[str, dict[str, list[Path]]] = {}
    for split in (SPLITS if layout == "split" else ("all",)):
        base = domain_dir / split if layout == "split" else domain_dir
        classes: dict[str, list[Path]] = {}
        for folder in sorted(p for p in base.iterdir() if p.is_dir() and not is_junk(p)):
            files = image_files(folder)
            if files:
                classes[folder.name] = files
            elif not allow_missing:
                raise DataFileError(f"class folder '{folder}' holds no images: add its images, or set "
                                    "data.options.allow_missing_classes: true to let this domain lack the class")
            else:
                log.warning("class folder '%s' holds no images: this domain lacks the class", folder)
        out[split] = classes
    return out


def _check_classes(scan: Scan, classes: Sequence[str], root: Path) -> None:
    """Every domain and split holds every class, else a ConfigError naming the first missing one."""
    for domain, splits in scan.items():
        for split, held in splits.items():
            for cls in classes:
                if cls in held:
                    continue
                where = f"domain '{domain}'" + (f", split '{split}'" if split != "all" else "")
                folder = root / domain / (split if split != "all" else "") / cls
                raise DataFileError(
                    f"class '{cls}' is missing from {where} (no images in '{folder}'){nearest(cls, held)}; every "
                    "domain must hold the same classes: add it, remove it from the other domains, or set "
                    "data.options.allow_missing_classes: true")


def scan_root(root: Path, domains: Sequence[str] | None, opts: ImageFolderOptions) -> tuple[list[str], Scan]:
    """(all domain names under `root`, the scan of the chosen ones); errors name what is wrong where."""
    if not root.is_dir():
        raise DatasetNotFoundError(f"dataset 'imagefolder': data.root '{root}' is not a folder; point data.root at "
                                   "the folder holding one folder per domain (<domain>/<class>/*.png)")
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and not is_junk(p))
    if not found:
        raise DatasetNotFoundError(f"dataset 'imagefolder': data.root '{root}' holds no domain folders; expected "
                                   "<root>/<domain>/<class>/*.png or <root>/<domain>/{train,test}/<class>/*.png")
    chosen = resolve_domains(replace(IMAGEFOLDER, domains=tuple(found)), list(domains) if domains else None)
    scan = {d: _scan_domain(root / d, _layout(root / d, opts.layout), opts.allow_missing_classes) for d in chosen}
    return found, scan


def _loader(scan: Scan, classes: Sequence[str], channels: int, root: Path) -> Loader:
    index = {c: i for i, c in enumerate(classes)}

    def read(held: dict[str, list[Path]], size: int) -> tuple[torch.Tensor, torch.Tensor]:
        files = [f for c in classes for f in held.get(c, [])]
        y = [index[c] for c in classes for _ in held.get(c, [])]
        return read_images(files, size, channels), torch.tensor(y, dtype=torch.int64)

    def load(ctx: LoadContext, domain: str) -> DomainData:
        splits = scan[domain]
        note = str(root / domain)
        if "all" in splits:
            return DomainData(*read(splits["all"], ctx.image_size), note=note)
        x, y = read(splits["train"], ctx.image_size)
        xt, yt = read(splits["test"], ctx.image_size)
        return DomainData(x, y, xt, yt, note=note)

    return load


def client_stats(ds: IndexedDataset, channels: int, chunk: int = 1024) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of a client's training images (uint8 scaled to [0, 1]), read in chunks."""
    total = np.zeros(channels)
    squares = np.zeros(channels)
    count = 0
    for part in ds.parts:
        for start in range(0, len(part.index), chunk):
            x = part.x[torch.from_numpy(np.asarray(part.index[start:start + chunk], np.int64))].double() / 255.0
            total += x.sum(dim=(0, 2, 3)).numpy()
            squares += (x * x).sum(dim=(0, 2, 3)).numpy()
            count += x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / max(count, 1)
    std = np.sqrt(np.maximum(squares / max(count, 1) - mean ** 2, 0.0))
    return mean.tolist(), np.where(std > 1e-6, std, 1.0).tolist()


def make_transforms(size: int, channels: int, mean: Sequence[float], std: Sequence[float], augment: bool,
                    hflip: bool, input_noise_std: float = 0.0) -> tuple[Transform, Transform]:
    """(train, eval) for uint8 C x H x W images: the built-in image recipe (`fedhet.data.transforms`) with the
    given normalisation; for grey images ColorJitter keeps brightness / contrast and drops RandomGrayscale."""
    to_float = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    eval_t = v2.Compose([v2.Resize((size, size), antialias=True), *to_float])
    if augment:
        steps: list[Any] = [v2.RandomResizedCrop(  # Any: torchvision v2 transforms
            size, scale=(0.6, 1.0), antialias=True)]
        if hflip:
            steps.append(v2.RandomHorizontalFlip(p=0.5))
        steps += ([v2.ColorJitter(0.3, 0.3, 0.3, 0.3), v2.RandomGrayscale(p=0.1)] if channels == 3
                  else [v2.ColorJitter(0.3, 0.3)])
        steps += to_float
    else:
        steps = [v2.Resize((size, size), antialias=True), *to_float]
    if input_noise_std > 0:
        steps.append(AddGaussianNoise(input_noise_std))
    return v2.Compose(steps), eval_t


def _transform_factory(opts: ImageFolderOptions) -> TransformFactory:
    def factory(train: IndexedDataset, cfg: DataConfig, size: int) -> tuple[Transform, Transform]:
        c = opts.channels
        mean: Sequence[float]
        std: Sequence[float]
        if opts.normalize == "imagenet":
            mean, std = (IMAGENET_MEAN, IMAGENET_STD) if c == 3 else IMAGENET_GREY
        elif opts.normalize == "client":
            mean, std = client_stats(train, c)
        elif opts.normalize == "fixed":
            mean, std = opts.mean or [], opts.std or []
        else:
            mean, std = [0.0] * c, [1.0] * c
        return make_transforms(size, c, mean, std, cfg.augment, opts.hflip, cfg.input_noise_std)

    return factory


def resolve(spec: DatasetSpec, opts: ImageFolderOptions, cfg: DataConfig) -> DatasetSpec:
    """The concrete spec: domains and classes read from `data.root`, checked to agree across domains."""
    if not cfg.root:
        raise ConfigError("dataset 'imagefolder' reads data.root: set it to the folder holding one folder per "
                          "domain (<domain>/<class>/*.png or <domain>/{train,test}/<class>/*.png)")
    root = Path(cfg.root).expanduser()
    found, scan = scan_root(root, cfg.domains, opts)
    classes = sorted({c for splits in scan.values() for held in splits.values() for c in held})
    if not classes:
        raise DatasetNotFoundError(f"dataset 'imagefolder': no images under '{root}' in the chosen domains")
    if not opts.allow_missing_classes:
        _check_classes(scan, classes, root)
    return replace(spec, domains=tuple(found), classes=tuple(classes), channels=opts.channels,
                               hflip=opts.hflip, loader=_loader(scan, classes, opts.channels, root),
                               transforms=_transform_factory(opts), resolve=None)


def _unresolved(ctx: LoadContext, domain: str) -> DomainData:
    raise ConfigError("dataset 'imagefolder' must be resolved first: use fedhet.data.registry.resolve_spec(cfg)")


IMAGEFOLDER = register_dataset(DatasetSpec(
    name="imagefolder", domains=(), classes=(), modality="image", loader=_unresolved,
    source="your own images (docs/data.md, 'Bring your own data')",
    layout="data.root = <folder>: <domain>/<class>/*.png, or <domain>/{train,test}/<class>/*.png",
    default_image_size=224, options=ImageFolderOptions, resolve=resolve,
))
