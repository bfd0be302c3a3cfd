"""Settings of `fedhet ldm pretrain`: the small LDM pretrained here for FedBiP (spec fedbip.md §7.1 item 1;
docs/fedbip.md "Pretraining the small LDM").

No pretrained LDM can be obtained offline, so θ is pretrained here on a "public" pool the clients' domains are
under-represented in (default: clean MNIST and Fashion-MNIST from fedhet's dataset registry), with prompts
`template` filled with each source's `word` and its class names, encoded by the frozen real MiniLM-L6.
Two stages: the VAE (`vae`: reconstruction + KL), then the cross-attention UNet (`unet`: DDPM ε-prediction on
the VAE's latents). The defaults fit about 45 minutes on 2 CPU cores (docs/fedbip.md gives the measurements).

A YAML file (or none: the defaults) plus `key=value` overrides (`unet.steps=500`, `vae.blocks=[16,32,64]`),
typed with fedhet's config reader: an unknown key is a ConfigError naming the nearest one. `key()` fingerprints
every setting that changes what is written (not `device`, `num_threads` or `save_every`): the cache key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.config.loading import parse_overrides, set_path
from fedhet.config.typed import from_dict
from fedhet.errors import ConfigError
from fedhet.models.ldm.prompts import PAPER_TEMPLATE, template_segments
from fedhet.yaml_input import load_yaml, read_text

SPLITS = ("train", "test", "all")
DEVICES = ("cpu", "cuda", "auto")
NOT_IN_KEY = ("device", "num_threads", "save_every")


@dataclass
class PoolSource:
    """One source of the public pool: a registered image dataset's domain, the prompt's {domain} `word` (empty:
    the domain's name), the split, at most `max_images` images (a seeded random subset), and optional prompt
    words per class (default: the dataset's class names)."""

    dataset: str = "digits"
    domain: str = "mnist"
    word: str = ""
    split: str = "train"
    max_images: int | None = 20000
    class_words: list[str] | None = None


def default_pool() -> list[PoolSource]:
    """Clean MNIST ("a mnist style of a 7") and Fashion-MNIST ("a fashion style of a sneaker")."""
    return [PoolSource("digits", "mnist", "mnist"), PoolSource("fashion_mnist", "fashion_mnist", "fashion")]


@dataclass
class VAESettings:
    """The AutoencoderKL and its stage: one down block per entry of `blocks` (image side / latent side =
    2^(len - 1)), L1 reconstruction + `kl_weight` · KL, grey images recoloured with probability `color_augment`."""

    blocks: list[int] = field(default_factory=lambda: [16, 32, 64])
    layers_per_block: int = 1
    latent_channels: int = 4
    norm_groups: int = 8
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    kl_weight: float = 1e-4
    color_augment: float = 0.5


@dataclass
class UNetSettings:
    """The UNet2DConditionModel (cross-attention on every level but the deepest, SD's pattern) and its stage:
    AdamW with linear warmup, gradient clipping, an EMA of the weights (what is saved) and condition dropout
    `uncond_prob` (the "" prompt, for classifier-free guidance)."""

    blocks: list[int] = field(default_factory=lambda: [48, 96, 96])
    layers_per_block: int = 1
    heads: int = 4
    norm_groups: int = 16
    steps: int = 4000
    batch_size: int = 128
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema_decay: float = 0.999
    uncond_prob: float = 0.1


@dataclass
class SampleSettings:
    """The sample grid written beside the checkpoint (samples.png): images per prompt (0: none), PNDM steps,
    classifier-free guidance scale (GenerationConfig's defaults: what FedBiP's server step uses)."""

    per_prompt: int = 4
    steps: int = 50
    guidance: float = 7.5


@dataclass
class LDMPretrainConfig:
    """Everything `fedhet ldm pretrain` needs (module doc)."""

    seed: int = 0
    image_size: int = 32
    template: str = PAPER_TEMPLATE
    pool: list[PoolSource] = field(default_factory=default_pool)
    data_root: str | None = None
    vae: VAESettings = field(default_factory=VAESettings)
    unet: UNetSettings = field(default_factory=UNetSettings)
    samples: SampleSettings = field(default_factory=SampleSettings)
    minutes: float | None = None
    vae_share: float = 0.25
    save_every: int = 250
    device: str = "cpu"
    num_threads: int | None = None

    def __post_init__(self) -> None:
        for src in self.pool:
            src.word = src.word.strip() or src.domain

    def to_dict(self) -> dict[str, Any]:  # Any: plain YAML data
        """The settings as plain data (JSON / YAML)."""
        return dataclasses.asdict(self)

    def key(self) -> str:
        """The cache key: a hash of every setting that changes the checkpoint (not NOT_IN_KEY)."""
        relevant = {k: v for k, v in self.to_dict().items() if k not in NOT_IN_KEY}
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]

    def validate(self) -> None:
        """A ConfigError naming the first bad setting."""
        _check(self.image_size >= 8, f"image_size must be >= 8, got {self.image_size}")
        factor = 2 ** (len(self.vae.blocks) - 1) * 2 ** (len(self.unet.blocks) - 1)
        _check(self.image_size % factor == 0, f"image_size {self.image_size} must be a multiple of {factor} (VAE "
               f"downsampling x UNet downsampling of vae.blocks {self.vae.blocks} and unet.blocks {self.unet.blocks})")
        template_segments(self.template)
        _check(bool(self.pool), "pool is empty: list at least one {dataset, domain, word} source")
        for i, src in enumerate(self.pool):
            _check(src.split in SPLITS, f"pool[{i}].split must be one of {', '.join(SPLITS)}, got '{src.split}'")
            _check(src.max_images is None or src.max_images >= 1, f"pool[{i}].max_images must be >= 1")
        pairs = [(s.dataset, s.domain) for s in self.pool]
        _check(len(set(pairs)) == len(pairs), f"pool lists a dataset domain twice: {pairs}")
        for name, stage in (("vae", self.vae), ("unet", self.unet)):
            _check(bool(stage.blocks) and all(b > 0 and b % stage.norm_groups == 0 for b in stage.blocks),
                   f"{name}.blocks must be positive multiples of {name}.norm_groups ({stage.norm_groups}), got "
                   f"{stage.blocks}")
            _check(stage.steps >= 1 and stage.batch_size >= 1 and stage.lr > 0,
                   f"{name}.steps, {name}.batch_size and {name}.lr must be positive")
        _check(self.unet.heads >= 1 and all(b % self.unet.heads == 0 for b in self.unet.blocks),
               f"unet.heads ({self.unet.heads}) must divide every entry of unet.blocks {self.unet.blocks}")
        _check(0 <= self.unet.uncond_prob < 1 and 0 <= self.unet.ema_decay < 1 and 0 <= self.vae.color_augment <= 1,
               "unet.uncond_prob and unet.ema_decay must lie in [0, 1), vae.color_augment in [0, 1]")
        _check(self.minutes is None or self.minutes > 0, f"minutes must be > 0, got {self.minutes}")
        _check(0 < self.vae_share < 1, f"vae_share must lie in (0, 1), got {self.vae_share}")
        _check(self.save_every >= 1 and self.samples.per_prompt >= 0 and self.samples.steps >= 1,
               "save_every and samples.steps must be >= 1, samples.per_prompt >= 0")
        _check(self.device in DEVICES, f"device must be one of {', '.join(DEVICES)}, got '{self.device}'")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(f"ldm pretrain: {message}")


def load_pretrain_config(path: str | Path | None = None, overrides: list[str] | None = None) -> LDMPretrainConfig:
    """The settings of a YAML file (None: the defaults) with `key=value` overrides, typed and validated."""
    parsed = parse_overrides(overrides or [])
    tree: dict[str, Any] = {}  # Any: plain YAML data
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"ldm pretrain config '{path}' not found (docs/fedbip.md lists the settings)")
        loaded = load_yaml(read_text(Path(path), "config file"), f"config file '{path}'")
        if not isinstance(loaded, dict):
            raise ConfigError(f"ldm pretrain config '{path}' must hold a mapping (e.g. unet: {{steps: 500}})")
        tree = loaded
    for key, value in parsed:
        set_path(tree, key, value)
    cfg = from_dict(LDMPretrainConfig, tree)
    cfg.validate()
    return cfg
