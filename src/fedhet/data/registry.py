"""The registry of domain datasets: each maps domain name -> (train arrays, optional official test arrays).

A spec may take dataset-specific settings (`options`, a dataclass filled from `data.options` with nearest-key
errors) and may discover its domains and classes at load time (`resolve`, e.g. `imagefolder` from `data.root`);
`resolve_spec(cfg)` returns the concrete spec for a config. See docs/data.md "Bring your own data".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedhet.config import DataConfig, from_dict
from fedhet.errors import ConfigError, unknown_choice
from fedhet.registry import Registry

if TYPE_CHECKING:
    from fedhet.data.datasets import IndexedDataset

@dataclass
class DomainData:
    """One domain in memory: images as uint8 NxCxHxW, features as float32 NxD, VQA as packed uint8 rows
    (fedhet.data.vqa_benchmarks); labels int64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor | None = None  # the official test split, when the source has one
    y_test: torch.Tensor | None = None
    generated: bool = False  # synthesised here rather than read from disk
    note: str = ""  # where the data came from (file path or generator)
    classes: tuple[int, ...] | None = None  # the class ids this domain's head may predict (None: all of them)

    def __post_init__(self) -> None:
        if len(self.x_train) != len(self.y_train):
            raise ValueError("x_train and y_train differ in length")
        if (self.x_test is None) != (self.y_test is None):
            raise ValueError("x_test and y_test must both be given or both be None")

    @property
    def has_test(self) -> bool:
        return self.x_test is not None


@dataclass(frozen=True)
class LoadContext:
    """What a loader needs besides the domain name."""

    root: Path | None
    image_size: int
    download: bool = False


Loader = Callable[[LoadContext, str], DomainData]
Transform = Callable[[torch.Tensor], torch.Tensor]
# (client's training samples, data config, image side) -> (train, eval) transforms
TransformFactory = Callable[["IndexedDataset", "DataConfig", int], tuple[Transform, Transform]]


@dataclass(frozen=True)
class DatasetSpec:
    """A registered domain dataset: its domains, classes, modality and how to load one domain."""

    name: str
    domains: tuple[str, ...]
    classes: tuple[str, ...]
    modality: str  # "image" | "features"
    loader: Loader
    source: str  # citation and official URL
    layout: str  # where the files go under the data root
    default_image_size: int | None = None  # images only
    hflip: bool = True  # horizontal flips are label-preserving (False for digits)
    feature_norm: str = "none"  # features only: "log_l2" | "impute_standardize" | "none"
    feature_dim: int | None = None
    builtin: bool = False  # needs no files on disk
    generated_domains: tuple[str, ...] = field(default=())  # domains that may be synthesised when absent
    channels: int = 3  # images only: channels of the model input
    options: type | None = None  # dataclass of the dataset's `data.options` (None: it takes none)
    # discovers domains / classes at load time: (spec, parsed options, data config) -> concrete spec
    resolve: Callable[[DatasetSpec, Any, DataConfig], DatasetSpec] | None = None  # Any: the spec's own options
    transforms: TransformFactory | None = None  # own (train, eval) transforms instead of the modality's default
    vocabulary: tuple[str, ...] = ()  # text / VQA: the words in word-id order (models taking `words=` get them)


DATASETS: Registry[DatasetSpec] = Registry("dataset", "fedhet.data")  # its modules register the built-ins


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Add a dataset spec to the registry."""
    DATASETS.register(spec.name)(spec)
    return spec


def get_spec(name: str) -> DatasetSpec:
    """The spec of dataset `name`; unknown names raise a ConfigError naming the nearest one."""
    return DATASETS.get(name)


def parse_options(spec: DatasetSpec, options: Mapping[str, Any]) -> Any:  # Any: parsed YAML in, spec.options out
    """`data.options` as the spec's options dataclass (nearest-key errors, then its `validate()`), or None."""
    if spec.options is None:
        if options:
            raise ConfigError(f"dataset '{spec.name}' takes no data.options, got: {', '.join(map(str, options))}; "
                              "remove data.options (docs/config.md lists each dataset's options)")
        return None
    opts: Any = from_dict(  # Any: the spec's own options dataclass
        spec.options, dict(options), "data.options")
    if hasattr(opts, "validate"):
        opts.validate()
    return opts


def resolve_spec(cfg: DataConfig) -> DatasetSpec:
    """The concrete spec for a data config: options parsed and, for discovering datasets, domains and classes
    read from `data.root`."""
    spec = get_spec(cfg.dataset)
    opts = parse_options(spec, cfg.options)
    return spec.resolve(spec, opts, cfg) if spec.resolve is not None else spec


def options_fields(spec: DatasetSpec) -> list[dataclasses.Field[Any]]:  # Any: any field's type
    """The fields of a spec's options dataclass (empty when it takes none)."""
    return list(dataclasses.fields(spec.options)) if spec.options is not None else []


def list_datasets() -> list[str]:
    """Names of all registered datasets."""
    return DATASETS.names()


def resolve_domains(spec: DatasetSpec, domains: list[str] | None) -> list[str]:
    """The requested domains in the given order (default: all); unknown names raise a ConfigError."""
    if domains is None:
        return list(spec.domains)
    if not domains:
        raise ConfigError(f"data.domains is empty; valid domains of '{spec.name}': {', '.join(spec.domains)}")
    for d in domains:
        if d not in spec.domains:
            raise unknown_choice(f"domain of dataset '{spec.name}'", d, spec.domains)
    if len(set(domains)) != len(domains):
        raise ConfigError(f"data.domains lists a domain twice: {domains}")
    return list(domains)


def load_domains(spec: DatasetSpec, domains: list[str], ctx: LoadContext) -> dict[str, DomainData]:
    """Load each requested domain with the spec's loader."""
    return {d: spec.loader(ctx, d) for d in domains}


@dataclass(frozen=True)
class DatasetInfo:
    """What `dataset_info` returns: enough to decide whether and how to use a dataset."""

    name: str
    domains: tuple[str, ...]
    classes: tuple[str, ...]
    modality: str
    default_image_size: int | None
    source: str
    layout: str
    builtin: bool
    generated_domains: tuple[str, ...]

    def __str__(self) -> str:
        lines = [
            f"dataset: {self.name} ({self.modality}{', built in' if self.builtin else ''})",
            f"domains: {', '.join(self.domains) or 'read from data.root when loaded'}",
            f"classes ({len(self.classes)}): {', '.join(self.classes)}" if self.classes
            else "classes: read from data.root when loaded",
        ]
        if self.default_image_size:
            lines.append(f"default image size: {self.default_image_size}")
        if self.generated_domains:
            lines.append(f"generated when absent on disk: {', '.join(self.generated_domains)}")
        lines += [f"source: {self.source}", f"layout: {self.layout}"]
        return "\n".join(lines)


def dataset_info(name: str) -> DatasetInfo:
    """Domains, classes, default image size, source and on-disk layout of dataset `name`."""
    s = get_spec(name)
    return DatasetInfo(s.name, s.domains, s.classes, s.modality, s.default_image_size, s.source, s.layout,
                       s.builtin, s.generated_domains)
