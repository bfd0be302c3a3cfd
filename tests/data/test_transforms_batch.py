"""Image transforms without augmentation run on whole batches (issue 42): the same values as image by image."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.data.datasets import IndexedDataset, Part
from fedhet.data.transforms import image_transforms


@pytest.mark.parametrize(("side", "size", "channels"), [(28, 28, 1), (28, 32, 3), (32, 28, 3)])
def test_unaugmented_image_transforms_batch_to_the_same_values(side: int, size: int, channels: int) -> None:
    x = torch.randint(0, 256, (6, channels, side, side), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for transform in image_transforms(size, augment=False, hflip=False):
        assert getattr(transform, "batchable", False)
        assert torch.equal(transform(x), torch.stack([transform(image) for image in x]))
    ds = IndexedDataset([Part("d", x, torch.arange(6), np.array([2, 0, 1, 5, 3, 4]))],
                        image_transforms(size, False, False)[0])
    got, labels = ds.batch([4, 0, 5])  # one gather of the part's rows 3, 2, 4 (index_select), then the transform
    assert torch.equal(got, torch.stack([ds[4][0], ds[0][0], ds[5][0]])) and labels.tolist() == [3, 2, 4]


def test_augmented_or_noised_training_images_stay_one_by_one() -> None:
    """Random transforms draw in sample order: not batchable (the evaluation transform still is)."""
    for train, evaluation in (image_transforms(32, True, True), image_transforms(32, False, False, 0.1)):
        assert not getattr(train, "batchable", False) and evaluation.batchable  # type: ignore[attr-defined]
