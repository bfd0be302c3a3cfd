"""Image and feature transforms."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from fedhet.data.transforms import (
    IMAGENET_MEAN,
    AddGaussianNoise,
    ImputeStandardize,
    LogL2Normalize,
    feature_transforms,
    image_transforms,
)


def _img() -> torch.Tensor:
    return torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def test_image_train_and_eval_shapes() -> None:
    train, evalt = image_transforms(28, augment=True, hflip=True)
    torch.manual_seed(0)
    a = train(_img())
    assert a.shape == (3, 28, 28) and a.dtype == torch.float32
    e1, e2 = evalt(_img()), evalt(_img())
    assert torch.equal(e1, e2)  # eval is deterministic
    zero = evalt(torch.zeros(3, 32, 32, dtype=torch.uint8))
    assert torch.allclose(zero[:, 0, 0], -torch.tensor(IMAGENET_MEAN) / torch.tensor([0.229, 0.224, 0.225]))


def test_augmentation_uses_torch_rng_and_recipe() -> None:
    train, _ = image_transforms(28, augment=True, hflip=True)
    torch.manual_seed(1)
    a = train(_img())
    torch.manual_seed(1)
    b = train(_img())
    assert torch.equal(a, b)
    kinds = [type(t) for t in train.transforms]
    assert kinds[:5] == [v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.ColorJitter, v2.RandomGrayscale,
                         v2.ToDtype]
    assert train.transforms[0].scale == (0.6, 1.0)


def test_no_flip_for_digits_and_augment_off() -> None:
    train, _ = image_transforms(28, augment=True, hflip=False)
    assert not any(isinstance(t, v2.RandomHorizontalFlip) for t in train.transforms)
    train, evalt = image_transforms(28, augment=False, hflip=True)
    assert torch.equal(train(_img()), evalt(_img()))


def test_input_noise() -> None:
    train, evalt = image_transforms(16, augment=False, hflip=False, input_noise_std=0.5)
    assert isinstance(train.transforms[-1], AddGaussianNoise)
    diff = train(_img()) - evalt(_img())
    assert 0.4 < diff.std().item() < 0.6


def test_log_l2_normalize() -> None:
    x = torch.tensor([0.0, 3.0, 0.0, 10.0])
    y = LogL2Normalize()(x)
    assert torch.allclose(y.norm(), torch.tensor(2.0)) and y[0] == 0
    assert torch.allclose(LogL2Normalize()(2 * x).norm(), torch.tensor(2.0))


def test_impute_standardize() -> None:
    x = torch.tensor([[1.0, float("nan"), 5.0], [3.0, 2.0, 5.0], [float("nan"), 4.0, 5.0]])
    t = ImputeStandardize.fit(x)
    assert torch.allclose(t.mean, torch.tensor([2.0, 3.0, 5.0]))
    out = torch.stack([t(r) for r in x])
    assert not torch.isnan(out).any()
    assert torch.allclose(out[2, 0], torch.tensor(0.0)) and torch.allclose(out[:, 2], torch.zeros(3))
    all_missing = ImputeStandardize.fit(torch.full((4, 2), float("nan")))
    assert torch.equal(all_missing(torch.tensor([float("nan"), 1.0])), torch.tensor([0.0, 1.0]))


def test_feature_transforms_noise_only_in_train() -> None:
    train, evalt = feature_transforms("log_l2", torch.ones(4, 8), input_noise_std=0.1)
    x = torch.arange(8.0)
    assert not torch.equal(train(x), evalt(x)) and torch.equal(evalt(x), evalt(x))


@pytest.mark.parametrize("shape", [(3, 28, 28), (3, 40, 30), (1, 28, 28)])
def test_resize_to_equals_torchvision_resize(shape) -> None:
    """The skip for images already at the size is exact: v2.Resize returns them unchanged too."""
    from fedhet.data.transforms import ResizeTo

    x = torch.randint(0, 255, shape, dtype=torch.uint8)
    assert torch.equal(ResizeTo(28)(x), v2.Resize((28, 28), antialias=True)(x))
