"""The public pool the small LDM is pretrained on (spec fedbip.md §7.1 item 1; docs/fedbip.md).

Each `PoolSource` is one domain of a dataset in fedhet's registry (`fedhet.data`: the data root is `data_root`
or $FEDHET_DATA, as for every run; Fashion-MNIST also falls back to Debian's dataset-fashion-mnist), read with
the dataset's own loader, never from a hard-coded path. Images are resized (bilinear, antialiased) to
`image_size` and kept as uint8 (N, 3, S, S); a source with more than `max_images` images keeps a random subset
drawn with the config's seed. Every (source, class) pair is one prompt: `template` with the source's `word` and
the class's name (or `class_words`), e.g. "a fashion style of a sneaker". Sources are stored one after another,
so sampling can weigh them equally whatever their sizes (`sample_indices`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedhet.config.sections import DataConfig
from fedhet.data.registry import LoadContext, resolve_domains, resolve_spec
from fedhet.errors import ConfigError, FedhetError
from fedhet.models.ldm.pretrain_config import LDMPretrainConfig, PoolSource


@dataclass(frozen=True)
class PoolPrompt:
    """One prompt of the pool: the source's {domain} word and the class's {class} word."""

    domain: str
    word: str


@dataclass
class PublicPool:
    """uint8 images (N, 3, S, S), prompt ids (N,) into `prompts`, each source's [start, end) rows and its
    (domain word, class words)."""

    images: torch.Tensor
    prompt_ids: torch.Tensor
    prompts: list[PoolPrompt]
    spans: list[tuple[int, int]]
    sources: list[tuple[str, list[str]]]

    def __len__(self) -> int:
        return len(self.images)

    def sample_indices(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n row indices: a uniformly drawn source, then a uniform row of it (sources weigh equally)."""
        which = torch.randint(0, len(self.spans), (n,), generator=generator)
        starts = torch.tensor([a for a, _ in self.spans])[which]
        sizes = torch.tensor([b - a for a, b in self.spans])[which]
        return starts + (torch.rand(n, generator=generator, dtype=torch.float64) * sizes).long().clamp(max=sizes - 1)


def resize_images(images: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    """uint8 (N, C, H, W) -> uint8 (N, C, size, size), bilinear with antialiasing (unchanged if already size)."""
    if images.shape[-2:] == (size, size):
        return images
    out = [F.interpolate(part.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
           .round().clamp(0, 255).to(torch.uint8) for part in images.split(chunk)]
    return torch.cat(out)


def load_source(src: PoolSource, cfg: LDMPretrainConfig,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(uint8 images at cfg.image_size, labels, class words) of one pool source, through the dataset registry."""
    data_cfg = DataConfig(dataset=src.dataset, root=cfg.data_root)
    root = data_cfg.resolved_root()
    if cfg.data_root is not None and (root is None or not root.is_dir()):
        raise FedhetError(f"ldm pretrain: data_root '{cfg.data_root}' is not a folder; point it (or FEDHET_DATA) "
                          "at the folder that holds your datasets")
    spec = resolve_spec(data_cfg)
    if spec.modality != "image":
        raise ConfigError(f"ldm pretrain: pool dataset '{src.dataset}' holds {spec.modality}, not images")
    resolve_domains(spec, [src.domain])  # an unknown domain names the nearest one
    data = spec.loader(LoadContext(root, cfg.image_size), src.domain)
    if src.split != "train" and data.x_test is None:
        raise ConfigError(f"ldm pretrain: '{src.dataset}/{src.domain}' has no official test split; use split: train")
    pairs: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
    if src.split in ("train", "all"):
        pairs.append((data.x_train, data.y_train))
    if src.split in ("test", "all"):
        pairs.append((data.x_test, data.y_test))
    x = torch.cat([a for a, _ in pairs if a is not None])
    y = torch.cat([b for _, b in pairs if b is not None]).long()
    if x.dim() != 4 or x.shape[1] != 3 or x.dtype != torch.uint8:
        raise FedhetError(f"ldm pretrain: '{src.dataset}/{src.domain}' gives images {x.dtype} {tuple(x.shape)}; the "
                          "LDM takes uint8 RGB (N, 3, H, W)")
    if src.max_images is not None and len(x) > src.max_images:
        keep = torch.randperm(len(x), generator=generator)[:src.max_images].sort().values
        x, y = x[keep], y[keep]
    words = list(src.class_words) if src.class_words is not None else list(spec.classes)
    if len(words) != len(spec.classes):
        raise ConfigError(f"ldm pretrain: pool source '{src.word}' gives {len(words)} class_words for the "
                          f"{len(spec.classes)} classes of '{src.dataset}' ({', '.join(spec.classes)})")
    return resize_images(x, cfg.image_size), y, words


def load_pool(cfg: LDMPretrainConfig) -> PublicPool:
    """The public pool of `cfg.pool` (module doc)."""
    generator = torch.Generator().manual_seed(cfg.seed)
    images: list[torch.Tensor] = []
    ids: list[torch.Tensor] = []
    prompts: list[PoolPrompt] = []
    spans: list[tuple[int, int]] = []
    sources: list[tuple[str, list[str]]] = []
    for src in cfg.pool:
        x, y, words = load_source(src, cfg, generator)
        if len(x) == 0:
            raise FedhetError(f"ldm pretrain: pool source '{src.dataset}/{src.domain}' ({src.split}) has no images")
        start = sum(len(i) for i in images)
        spans.append((start, start + len(x)))
        ids.append(y + len(prompts))
        prompts += [PoolPrompt(src.word, w) for w in words]
        sources.append((src.word, words))
        images.append(x)
    return PublicPool(torch.cat(images), torch.cat(ids), prompts, spans, sources)
