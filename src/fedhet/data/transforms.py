"""Per-sample transforms on in-memory tensors (FRAug appendix recipe for images; normalisers for features).

Images are uint8 CxHxW tensors transformed with torchvision.transforms.v2 (no PIL round trip):
- train: RandomResizedCrop(size, scale=(0.6, 1.0)), RandomHorizontalFlip(0.5; 0 for digit datasets, where a
  flip changes the digit), ColorJitter(0.3, 0.3, 0.3, 0.3), RandomGrayscale(0.1), ImageNet normalisation;
- eval: Resize((size, size)) and ImageNet normalisation.
Training inputs get N(0, sigma^2) noise after normalisation when input_noise_std > 0 (FRAug Table 6).
Randomness comes from torch's global RNG, which the engine seeds per client and round.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from fedhet.errors import unknown_choice


def gaussian_blur(x: torch.Tensor, sigma: float, truncate: float = 2.5) -> torch.Tensor:
    """Separable Gaussian blur of float n x c x H x W (replicate padding), radius ceil(truncate * sigma) >= 1."""
    r = max(1, math.ceil(truncate * sigma))
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    k = torch.exp(-(t**2) / (2 * sigma**2))
    k = k / k.sum()
    c = x.shape[1]
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(F.pad(x, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Transform = Callable[[torch.Tensor], torch.Tensor]
FEATURE_NORMS = ("log_l2", "l1_zscore", "impute_standardize", "none")  # feature_transforms' normalisers


class AddGaussianNoise:
    """x + N(0, std^2) noise (torch's global RNG)."""

    def __init__(self, std: float) -> None:
        self.std = std

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.std * torch.randn_like(x)

    def __repr__(self) -> str:
        return f"AddGaussianNoise(std={self.std})"


class ResizeTo:
    """`v2.Resize((size, size), antialias=True)` without its dispatch when the image already has that size (the
    kernel returns such an image unchanged, so the result is the same; per sample, the dispatch alone cost ~20% of
    a small CNN's round on 28 px Fashion-MNIST)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) == (self.size, self.size):
            return x
        resized: torch.Tensor = v2.functional.resize(x, [self.size, self.size], antialias=True)  # torchvision: untyped
        return resized

    def __repr__(self) -> str:
        return f"ResizeTo({self.size})"


class ImageBatchCompose:
    """`v2.Compose` of steps that treat each image of a batch on its own and draw no random numbers (resize,
    scaling to float, per-channel normalisation): `batchable`, so a client's batch is transformed in one call
    rather than image by image (issue 42), the same values (tests/data/test_transforms_batch.py)."""

    batchable = True

    def __init__(self, steps: list[Transform]) -> None:
        self.compose = v2.Compose(steps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.compose(x)  # torchvision: untyped
        return out

    def __repr__(self) -> str:
        return repr(self.compose)


def image_transforms(size: int, augment: bool, hflip: bool,
                     input_noise_std: float = 0.0) -> tuple[Transform, Transform]:
    """(train, eval) transforms for uint8 CxHxW images -> float32 3 x size x size; without augmentation or noise,
    applied to whole batches (`ImageBatchCompose`)."""
    to_float = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    eval_t = ImageBatchCompose([ResizeTo(size), *to_float])
    if augment:
        steps: list[Transform] = [v2.RandomResizedCrop(size, scale=(0.6, 1.0), antialias=True)]
        if hflip:
            steps.append(v2.RandomHorizontalFlip(p=0.5))
        steps += [v2.ColorJitter(0.3, 0.3, 0.3, 0.3), v2.RandomGrayscale(p=0.1), *to_float]
    else:
        steps = [ResizeTo(size), *to_float]
    if input_noise_std > 0:
        steps.append(AddGaussianNoise(input_noise_std))
    return (v2.Compose if augment or input_noise_std > 0 else ImageBatchCompose)(steps), eval_t


class LogL2Normalize:
    """Bag-of-words histograms: log1p(counts), then scale each sample to L2 norm sqrt(D) (unit RMS per entry).

    log1p tames the heavy-tailed counts; the per-sample L2 step removes the dependence on how many
    keypoints an image has; the sqrt(D) factor keeps entries O(1) for an MLP. It needs no statistics, so no
    client shares anything and train/val/test are treated alike.
    """

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.log1p(x.float().clamp_min(0))
        scale: torch.Tensor = math.sqrt(x.numel()) / x.norm().clamp_min(1e-8)  # torch: float / Tensor is untyped
        return x * scale

    def __repr__(self) -> str:
        return "LogL2Normalize()"


class L1ZScore:
    """Bag-of-words histograms as the domain-adaptation literature prepares them (e.g. the GFK / JDA code for
    Office-Caltech10 SURF): each sample divided by its L1 norm (its total count), then every feature z-scored
    with the mean and sample std of the client's own training split, i.e. per domain with one client per domain.
    Features constant in that split get std 1.
    """

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean, self.std = mean.float(), std.float()

    @staticmethod
    def l1(x: torch.Tensor) -> torch.Tensor:
        """Each sample (last dimension) divided by its L1 norm; an all-zero sample stays zero."""
        x = x.float()
        return x / x.abs().sum(-1, keepdim=True).clamp_min(1e-12)

    @classmethod
    def fit(cls, x: torch.Tensor) -> L1ZScore:
        """Mean and sample std of the L1-normalised training samples x (N x D)."""
        u = cls.l1(x)
        std = u.std(0, unbiased=len(u) > 1)
        return cls(u.mean(0), torch.where(std > 1e-12, std, torch.ones_like(std)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.l1(x) - self.mean) / self.std

    def __repr__(self) -> str:
        return f"L1ZScore(dim={self.mean.numel()})"


class ImputeStandardize:
    """Replace NaN by the fitted mean, then (x - mean) / std, with statistics from one client's training split."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean, self.std = mean.float(), std.float()

    @classmethod
    def fit(cls, x: torch.Tensor) -> ImputeStandardize:
        """Per-feature nan-mean and nan-std of x (N x D); all-missing features get mean 0, constant ones std 1."""
        x = x.float()
        valid = ~torch.isnan(x)
        count = valid.sum(0).clamp_min(1)
        mean = torch.where(valid, x, 0.0).sum(0) / count
        var = torch.where(valid, (x - mean) ** 2, 0.0).sum(0) / count
        std = var.sqrt()
        return cls(mean, torch.where(std > 1e-6, std, torch.ones_like(std)))

    batchable = True  # elementwise (mean / std broadcast over the feature dimension)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.where(torch.isnan(x), self.mean, x.float())
        return (x - self.mean) / self.std

    def __repr__(self) -> str:
        return f"ImputeStandardize(dim={self.mean.numel()})"


class ToFloat:
    """Cast to float32."""

    batchable = True  # elementwise: applied to a stacked batch, the same values as sample by sample

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()

    def __repr__(self) -> str:
        return "ToFloat()"


class Compose:
    """Apply transforms in order."""

    def __init__(self, *steps: Transform) -> None:
        self.steps = steps
        self.batchable = all(getattr(s, "batchable", False) for s in steps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for s in self.steps:
            x = s(x)
        return x


def feature_transforms(norm: str, train_x: torch.Tensor,
                       input_noise_std: float = 0.0) -> tuple[Transform, Transform]:
    """(train, eval) transforms for feature vectors; `train_x` is the client's training features (for fitting)."""
    if norm == "log_l2":
        base: Transform = LogL2Normalize()
    elif norm == "l1_zscore":
        base = L1ZScore.fit(train_x)
    elif norm == "impute_standardize":
        base = ImputeStandardize.fit(train_x)
    elif norm == "none":
        base = ToFloat()
    else:
        raise unknown_choice("data.feature_norm", norm, FEATURE_NORMS)
    train = Compose(base, AddGaussianNoise(input_noise_std)) if input_noise_std > 0 else base
    return train, base
