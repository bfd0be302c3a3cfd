"""The Digits CNN of FedBN (Li et al., ICLR 2021; github.com/med-air/FedBN, nets/models.py `DigitModel`).

Also the Digits backbone of FRAug (Chen et al., ICCV 2023, appendix). With a 3x28x28 input the flattened conv
output is 6272 (as in the paper); with 3x32x32 it is 8192 and the network has 18,151,370 parameters for 10
classes. `norm="none"` drops every BatchNorm (for `torch.func.vmap`-style per-sample use).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedhet.models.base import (
    SplitModel,
    check_image_shape,
    check_norm,
    no_pretrained,
    norm1d,
    norm2d,
    register_model,
)


@register_model("digits_cnn")
def digits_cnn(
    num_classes: int, input_shape: tuple[int, ...], pretrained: bool = False, *, norm: str = "bn"
) -> SplitModel:
    """FedBN DigitModel: 3 conv blocks (64, 64, 128; 5x5) + FC 2048 + FC 512 features, FC head."""
    no_pretrained("digits_cnn", pretrained)
    check_norm("digits_cnn", norm)
    c, h, w = check_image_shape("digits_cnn", input_shape, min_side=4)
    flat = 128 * (h // 2 // 2) * (w // 2 // 2)
    features = nn.Sequential(
        OrderedDict(
            [
                ("conv1", nn.Conv2d(c, 64, 5, 1, 2)),
                ("bn1", norm2d(norm, 64)),
                ("relu1", nn.ReLU()),
                ("pool1", nn.MaxPool2d(2)),
                ("conv2", nn.Conv2d(64, 64, 5, 1, 2)),
                ("bn2", norm2d(norm, 64)),
                ("relu2", nn.ReLU()),
                ("pool2", nn.MaxPool2d(2)),
                ("conv3", nn.Conv2d(64, 128, 5, 1, 2)),
                ("bn3", norm2d(norm, 128)),
                ("relu3", nn.ReLU()),
                ("flatten", nn.Flatten()),
                ("fc1", nn.Linear(flat, 2048)),
                ("bn4", norm1d(norm, 2048)),
                ("relu4", nn.ReLU()),
                ("fc2", nn.Linear(2048, 512)),
                ("bn5", norm1d(norm, 512)),
                ("relu5", nn.ReLU()),
            ]
        )
    )
    return SplitModel(features, nn.Linear(512, num_classes), 512, num_classes)
