"""FedBiP's pieces around the LDM (the method: `fedhet.algorithms.fedbip`; the LDM steps: `fedhet.models.ldm`).

- Images between the classifier and the LDM (`ImageFormat`): a client's inputs are its dataset's eval-transformed
  tensors (normalised, at `data.image_size`); the LDM takes RGB in [0, 1] at its own sample size. `to_ldm` undoes
  the normalisation, repeats a grey channel and resizes; `to_classifier` maps generated images back (resize,
  grey = channel mean, normalise) so the classifier sees synthetic images exactly as it will see real ones.
- The synthetic set (`synthesize`, Alg. 1 ServerUpdate lines 4-7 x multiplier): `multiplier` copies of the
  client's uploaded latents, image j from latent j mod N with its own η of Ŝ (FedBiP-S / M / L: multiplier
  2 / 5 / 10) and, with `start_latent: fresh`, its own start latent. Generation runs in parts of at most `chunk`
  latents; part m of copy k draws its η (and its start noise: without z(T), or with a fresh start) from a
  generator seeded by (seed, client, k, m), so a part is the same whether it is generated in one go, after a
  restart, or for a larger multiplier. Finished parts are kept in a cache directory (atomic files, keyed by a hash
  of the upload, the LDM and every generation setting but the multiplier), so a killed run regenerates only the
  missing parts and FedBiP-S reuses the first copies of FedBiP-L.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedhet.atomic import atomic_torch_save
from fedhet.core.seeding import torch_generator
from fedhet.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from fedhet.errors import ConfigError
from fedhet.models.ldm.client import FedBiPUpload
from fedhet.models.ldm.generate import GenerationConfig, generate

log = logging.getLogger(__name__)

NORMALIZATIONS = ("imagenet", "none", "fixed")


@dataclass(frozen=True)
class ImageFormat:
    """How the classifier's inputs are normalised: x_model = (x_[0,1] - mean) / std per channel."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, normalize: str, mean: list[float] | None = None, std: list[float] | None = None) -> ImageFormat:
        """`imagenet` (fedhet's image datasets), `none` (inputs already in [0, 1]) or `fixed` mean / std."""
        if normalize == "imagenet":
            return cls(IMAGENET_MEAN, IMAGENET_STD)
        if normalize == "none":
            return cls((0.0,), (1.0,))
        if normalize != "fixed" or not mean or not std or len(mean) != len(std) or min(std) <= 0:
            raise ConfigError(f"fedbip method_args.normalize must be one of {NORMALIZATIONS} ('fixed' with "
                              f"equal-length mean and positive std lists), got '{normalize}' with mean {mean} and "
                              f"std {std}")
        return cls(tuple(mean), tuple(std))

    def _stats(self, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = torch.tensor(self.mean), torch.tensor(self.std)
        if len(mean) not in (1, channels):
            if channels != 1:
                raise ConfigError(f"normalisation has {len(mean)} channels, the images {channels}")
            mean, std = mean.mean(), std.mean()  # grey images under RGB statistics
        return mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)

    def to_ldm(self, x: torch.Tensor, side: int) -> torch.Tensor:
        """(N, C, H, W) classifier inputs -> (N, 3, side, side) RGB in [0, 1]."""
        if x.dim() != 4 or x.shape[1] not in (1, 3):
            raise ConfigError(f"fedbip needs 1- or 3-channel images (N, C, H, W), got {tuple(x.shape)}")
        mean, std = self._stats(x.shape[1])
        unit = (x.float() * std + mean).clamp(0, 1)
        if unit.shape[1] == 1:
            unit = unit.expand(-1, 3, -1, -1)
        if tuple(unit.shape[-2:]) != (side, side):
            unit = F.interpolate(unit, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
        return unit.clamp(0, 1)

    def to_classifier(self, images: torch.Tensor, channels: int, height: int, width: int) -> torch.Tensor:
        """(N, 3, s, s) generated images in [0, 1] -> (N, channels, height, width) classifier inputs."""
        x = images.float()
        if tuple(x.shape[-2:]) != (height, width):
            x = F.interpolate(x, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
        if channels == 1:
            x = x.mean(dim=1, keepdim=True)
        mean, std = self._stats(channels)
        return (x.clamp(0, 1) - mean) / std


def upload_key(upload: FedBiPUpload, *settings: object) -> str:
    """A hash of the upload's tensors and every setting that changes what is generated from it."""
    h = hashlib.sha256()
    for t in upload.tensors().values():
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    h.update(repr(settings).encode())
    return h.hexdigest()[:24]


@dataclass(frozen=True)
class SynthesisPlan:
    """One client's synthetic set: `multiplier` copies of its N uploaded latents, each image with its own η,
    generated in parts of at most `chunk` images (the unit of resumption); `use_latents`: start from the uploaded
    latents (else fresh N(0, I), Table 3's rows without z(T)); `redraw`: the std of a fresh ξ added to them for
    every image (√(1 − ᾱ_T) when the upload holds z(T)'s centre, `start_latent: fresh`; 0: start from them as
    they are)."""

    multiplier: int
    chunk: int
    use_latents: bool
    seed: int
    client: int
    redraw: float = 0.0

    def key_fields(self) -> tuple[object, ...]:
        """What makes a part's content (not `multiplier`: copy k is the same in every larger set, so FedBiP-S's
        images are the first copies of FedBiP-L's and a size sweep generates each copy once)."""
        return self.chunk, self.use_latents, self.seed, self.client, self.redraw


Generate = Callable[[FedBiPUpload, GenerationConfig, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class TimedGeneration:
    """`generate` with the encoder bound, counting the images it makes and the seconds it takes."""

    encoder: Any  # Any: diffusers / transformers: untyped
    seconds: float = 0.0
    images: int = 0

    def __call__(self, upload: FedBiPUpload, config: GenerationConfig,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        out = generate(self.encoder, upload, config, generator)
        self.seconds += time.perf_counter() - start
        self.images += len(upload.labels)
        return out


def synthesize(upload: FedBiPUpload, plan: SynthesisPlan, generation: GenerationConfig, run: Generate,
               cache: Path | None, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 (M, 3, s, s), labels (M,)), M = multiplier x N, copy after copy (image j from latent
    j mod N): each part from `cache/key` where it exists, else made by `run` (e.g. a TimedGeneration) with the
    generator of (seed, client, copy, part) and saved there atomically."""
    n = len(upload.labels)
    images, labels = [], []
    for copy in range(plan.multiplier):
        for part, start in enumerate(range(0, n, plan.chunk)):
            path = cache / key / f"copy{copy:03d}_part{part:04d}.pt" if cache is not None else None
            if path is not None and path.is_file():
                saved = torch.load(path, weights_only=True)
            else:
                saved = _generate_part(upload, slice(start, min(start + plan.chunk, n)), plan, (copy, part),
                                       generation, run)
                if path is not None:
                    atomic_torch_save(saved, path)
            images.append(saved["images"])
            labels.append(saved["labels"])
    if not images:
        return torch.zeros((0, 3, 1, 1), dtype=torch.uint8), torch.zeros(0, dtype=torch.long)
    return torch.cat(images), torch.cat(labels)


def _generate_part(upload: FedBiPUpload, rows: slice, plan: SynthesisPlan, where: tuple[int, int],
                   generation: GenerationConfig, run: Generate) -> dict[str, torch.Tensor]:
    """One part: uint8 images of the uploaded latents `rows` (or fresh noise) and their labels."""
    g = torch_generator(plan.seed, "fedbip-generate", plan.client, *where)
    latents = upload.latents[rows]
    if not plan.use_latents:
        latents = torch.randn(latents.shape, generator=g)
    elif plan.redraw:  # a fresh start latent per image around the uploaded centre (start_latent: fresh)
        latents = latents + plan.redraw * torch.randn(latents.shape, generator=g).to(latents.dtype)
    x, y = run(FedBiPUpload(latents, upload.labels[rows], upload.domain, upload.classes), generation, g)
    return {"images": (x.clamp(0, 1) * 255).round().to(torch.uint8), "labels": y}
