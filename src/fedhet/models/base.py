"""The `SplitModel` contract, the model registry and `build_model`.

Every network is split into a feature extractor `features: x -> u (B, feature_dim)` and a classifier
`head: u -> logits (B, num_classes)`, as used by feature-level methods (FedBN, FedRep, FRAug, ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedhet.errors import ConfigError, nearest
from fedhet.registry import Registry

NORMS = ("bn", "none")
NORM_TYPES: tuple[type[nn.Module], ...] = (  # the normalisation layers (FedBN's local part, the "norm" presets)
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.instancenorm._InstanceNorm,
)

ModelFactory = Callable[..., "SplitModel"]
MODELS: Registry[ModelFactory] = Registry("model", "fedhet.models")  # its modules register the built-ins


class SplitModel(nn.Module):
    """features: x -> u (B, feature_dim); head: u -> logits (B, num_classes); forward = head(features(x))."""

    features: nn.Module
    head: nn.Module
    feature_dim: int
    num_classes: int

    def __init__(self, features: nn.Module, head: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.head = head
        self.feature_dim = int(feature_dim)
        self.num_classes = int(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))  # nn.Module calls are untyped in torch
        return out

    def extra_repr(self) -> str:
        return f"feature_dim={self.feature_dim}, num_classes={self.num_classes}"


def register_model(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Register a factory `f(num_classes, input_shape, pretrained, **args) -> SplitModel` under `name`."""
    return MODELS.register(name)


def list_models() -> list[str]:
    """The registered model names, sorted."""
    return MODELS.names()


def _model_args(factory: ModelFactory) -> dict[str, Any]:  # Any: model factory kwargs
    """The keyword-only arguments of a factory and their defaults."""
    sig = inspect.signature(factory)
    return {p.name: p.default for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def model_args(name: str) -> dict[str, Any]:  # Any: model factory kwargs
    """The extra arguments model `name` accepts, with their defaults."""
    return _model_args(MODELS.get(name))


def build_model(
    name: str, num_classes: int, input_shape: tuple[int, ...], pretrained: bool = False,
    vocabulary: Sequence[str] = (), **args: Any  # Any: model factory kwargs
) -> SplitModel:
    """Build registered model `name`; unknown names or arguments raise a ConfigError naming valid ones. A model
    taking `words=` (its text vocabulary) gets the data's `vocabulary` unless `words` or `token_map` is given."""
    factory = MODELS.get(name)
    valid = _model_args(factory)
    if vocabulary and "words" in valid and not args.get("words") and not args.get("token_map"):
        args = {**args, "words": list(vocabulary)}
    for key in args:
        if key not in valid:
            choices = ", ".join(sorted(valid)) or "(none)"
            hint = nearest(key, valid)
            raise ConfigError(f"model '{name}' got unexpected argument '{key}'{hint}; valid arguments: {choices}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"model '{name}': num_classes must be a positive integer, got {num_classes!r}")
    shape = tuple(input_shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ConfigError(f"model '{name}': input_shape must be positive integers, got {input_shape!r}")
    model = factory(num_classes, shape, bool(pretrained), **args)
    if not isinstance(model, SplitModel):
        raise ConfigError(f"model factory '{name}' returned {type(model).__name__}, not a fedhet.models.SplitModel "
                          "(features + head; docs/models.md)")
    if not getattr(factory, "__module__", "").startswith("fedhet.models"):
        check_plugin_shapes(name, model, shape)
    return model


def check_plugin_shapes(name: str, model: SplitModel, shape: tuple[int, ...]) -> None:
    """A plug-in model's features give (B, feature_dim) and its head takes them, on a zero batch of `shape` (eval
    mode, no gradient: nothing is updated); else one ConfigError naming both sizes (docs/models.md)."""
    if len(shape) not in (1, 3):  # text / VQA inputs are not one tensor
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                u = model.features(torch.zeros(2, *shape))
            except RuntimeError as err:
                raise ConfigError(f"model '{name}': its features fail on an input of shape {shape} (the data's): "
                                  f"{str(err).splitlines()[0]}") from err
            if not isinstance(u, torch.Tensor) or u.dim() != 2 or u.shape[1] != model.feature_dim:
                got = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
                raise ConfigError(f"model '{name}': its features return {got} for a batch of 2, but feature_dim is "
                                  f"{model.feature_dim}: they must return (batch, feature_dim) (docs/models.md)")
            try:
                model.head(u)
            except RuntimeError as err:
                raise ConfigError(f"model '{name}': its head does not take the features' (2, {model.feature_dim}): "
                                  f"{str(err).splitlines()[0]}") from err
    finally:
        model.train(was_training)


def check_norm(model: str, norm: str) -> None:
    """Raise a ConfigError unless `norm` is one of NORMS."""
    if norm not in NORMS:
        raise ConfigError(f"model '{model}': norm must be one of {', '.join(NORMS)}, got {norm!r}")


def positive(model: str, name: str, value: object) -> int:
    """`value` as a positive int, else a ConfigError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"model '{model}': {name} must be a positive integer, got {value!r}")
    return value


def check_image_shape(model: str, input_shape: Sequence[int], min_side: int = 1) -> tuple[int, int, int]:
    """Validate a (C, H, W) image shape and return it."""
    if len(input_shape) != 3:
        raise ConfigError(f"model '{model}' needs an image input_shape (C, H, W), got {tuple(input_shape)}")
    c, h, w = (int(s) for s in input_shape)
    if h < min_side or w < min_side:
        raise ConfigError(f"model '{model}' needs inputs of at least {min_side}x{min_side}, got {h}x{w}")
    return c, h, w


def no_pretrained(model: str, pretrained: bool) -> None:
    """Raise a ConfigError when pretrained weights are asked of a model that has none."""
    if pretrained:
        withw = ", ".join(n for n in ("efficientnet_lite0", "resnet18") if n in MODELS)
        raise ConfigError(f"model '{model}' has no pretrained weights; models with weights: {withw}")


def norm2d(norm: str, channels: int) -> nn.Module:
    """BatchNorm2d for 'bn', Identity for 'none'."""
    return nn.BatchNorm2d(channels) if norm == "bn" else nn.Identity()


def norm1d(norm: str, features: int) -> nn.Module:
    """BatchNorm1d for 'bn', Identity for 'none'."""
    return nn.BatchNorm1d(features) if norm == "bn" else nn.Identity()
