"""FocalNet (Yang et al., NeurIPS 2022) from `timm` as a fedhet SplitModel, sized for 28-32 px images on CPU.

The AdaptFED / TransFed backbone (spec §2.5, §7a.1): each block is x <- x + FM(LN(x)), x <- x + MLP(LN(x)) with
focal modulation FM(x) = proj(q * h(sum_l g_l ctx_l + g_{L+1} ctx_global)), [q, ctx, g] = f(x) (Eq. 1 of the
paper is y_i = tau(A(i, X), Q_i)). The architecture is timm's `timm.models.focalnet.FocalNet` (NCHW, 1x1 convs
for f, h, proj and the MLP); only the patch-embedding stem is rebuilt when `patch_size` != 4 (timm fixes it at
4). Stage s > 0 halves the map (and doubles the width), so an input side must be >= patch_size * 2^(stages-1).

features(x) = timm's forward without classifier: stem, stages, final LayerNorm, global average pool ->
(B, embed_dim * 2^(stages-1)); head = Linear(feature_dim, num_classes). Which tensors the hypernetwork
generates (P) and which are shared (xi) is `fedhet.models.param_partition.split_parameters`.

No FocalNet weights can be downloaded here: `checkpoint=PATH` loads a local timm or microsoft/FocalNet state
dict whose configuration matches (e.g. embed_dim=96, depths=[2, 2, 6, 2], patch_size=4 for focalnet_tiny_srf;
the classifier is dropped); `pretrained=True` without a checkpoint is a ConfigError. Needs `pip install
'fedhet[vision]'` (timm). Defaults (ours, docs/models/focalnet.md): one isotropic stage of 8 blocks (the paper's
default block count, spec §2.10 / §7b), width 32, patch 4, focal level 2, window 3, MLP ratio 4.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from fedhet.errors import ConfigError, FedhetError
from fedhet.models.base import SplitModel, check_image_shape, positive, register_model

TIMM_MISSING = "{what} needs the package 'timm' (the model architectures): pip install 'fedhet[vision]'"


def import_timm_module(module: str, what: str) -> Any:  # Any: untyped timm
    """The module `timm.models.<module>`, or a FedhetError naming the `vision` extra."""
    try:
        return importlib.import_module(f"timm.models.{module}")
    except ImportError as e:
        raise FedhetError(TIMM_MISSING.format(what=what)) from e


def _per_stage(name: str, value: int | Sequence[int], stages: int) -> tuple[int, ...]:
    """An int for every stage, or one value per stage."""
    values = [value] * stages if isinstance(value, int) else list(value)
    if len(values) != stages:
        raise ConfigError(f"model 'focalnet': {name} needs one value per stage ({stages}), got {value!r}")
    return tuple(positive("focalnet", name, v) for v in values)


def focalnet_min_side(patch_size: int, stages: int) -> int:
    """The smallest input side the stem (stride patch_size) and the stages' 2x downsampling keep >= 1 px."""
    return int(patch_size * 2 ** (stages - 1))


def check_focalnet_input(input_shape: Sequence[int], patch_size: int, stages: int) -> tuple[int, int, int]:
    """(C, H, W) of an image big enough for the stem and every stage; a ConfigError saying what to change."""
    c, h, w = check_image_shape("focalnet", input_shape)
    need = focalnet_min_side(patch_size, stages)
    if h < need or w < need:
        raise ConfigError(
            f"model 'focalnet' with patch_size {patch_size} and {stages} stage(s) needs inputs of at least "
            f"{need}x{need} (the stem divides by {patch_size}, each later stage halves), got {h}x{w}; "
            "use a smaller patch_size or fewer stages (depths)")
    return c, h, w


def _load_checkpoint(focalnet: Any, net: nn.Module, path: str) -> None:  # Any: untyped timm
    """Load a local timm / microsoft FocalNet state dict into `net` (its classifier dropped)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise FedhetError(f"model 'focalnet': cannot read checkpoint '{path}' ({e}); give a local timm or "
                          "microsoft/FocalNet state dict (fedhet downloads no weights)") from e
    state = focalnet.checkpoint_filter_fn(state, net)
    state = {k: v for k, v in state.items() if not k.startswith("head.")}
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1].strip()
        raise FedhetError(f"model 'focalnet': checkpoint '{path}' does not fit this configuration ({first}); "
                          "set embed_dim, depths, focal_level, focal_window, patch_size to the checkpoint's") from e
    if missing or unexpected:
        raise FedhetError(f"model 'focalnet': checkpoint '{path}' does not fit this configuration (missing "
                          f"{list(missing)[:3]}, unexpected {list(unexpected)[:3]}); match its depths/embed_dim")


@register_model("focalnet")
def focalnet_model(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    embed_dim: int = 32,
    depths: Sequence[int] = (8,),
    focal_level: int | Sequence[int] = 2,
    focal_window: int | Sequence[int] = 3,
    patch_size: int = 4,
    mlp_ratio: float = 4.0,
    drop_path_rate: float = 0.0,
    normalize_modulator: bool = False,
    checkpoint: str = "",
) -> SplitModel:
    """timm FocalNet features (pooled, width embed_dim * 2^(len(depths)-1)) + Linear head.

    The input's channels come from `input_shape` (1 for Fashion-MNIST, 3 for RGB). `depths` gives the blocks
    per stage; `focal_level` / `focal_window` are one value or one per stage (window of level l is
    focal_window + 2l, spec §2.5). `checkpoint` loads a matching local state dict; `pretrained=True` needs it.
    """
    blocks = tuple(positive("focalnet", "depths", d) for d in ([depths] if isinstance(depths, int) else depths))
    if not blocks:
        raise ConfigError("model 'focalnet': depths needs at least one stage, e.g. [8] or [2, 2]")
    stages = len(blocks)
    positive("focalnet", "embed_dim", embed_dim)
    positive("focalnet", "patch_size", patch_size)
    if not mlp_ratio > 0 or not 0.0 <= drop_path_rate < 1.0:
        raise ConfigError("model 'focalnet': mlp_ratio must be > 0 and drop_path_rate in [0, 1)")
    if pretrained and not checkpoint:
        raise ConfigError("model 'focalnet': no FocalNet weights can be downloaded here; give checkpoint=PATH "
                          "(a local timm/microsoft FocalNet state dict of the same configuration) or "
                          "pretrained: false")
    c, _, _ = check_focalnet_input(input_shape, patch_size, stages)
    focalnet = import_timm_module("focalnet", "model 'focalnet'")
    net = focalnet.FocalNet(
        in_chans=c, num_classes=0, embed_dim=embed_dim, depths=blocks, mlp_ratio=float(mlp_ratio),
        focal_levels=_per_stage("focal_level", focal_level, stages),
        focal_windows=_per_stage("focal_window", focal_window, stages),
        normalize_modulator=bool(normalize_modulator), drop_path_rate=float(drop_path_rate))
    if patch_size != 4:
        net.stem = focalnet.Downsample(c, embed_dim, stride=patch_size,
                                       norm_layer=partial(focalnet.LayerNorm2d, eps=1e-5))
        nn.init.trunc_normal_(net.stem.proj.weight, std=0.02)  # as timm's _init_weights
        nn.init.zeros_(net.stem.proj.bias)
    if checkpoint:
        _load_checkpoint(focalnet, net, checkpoint)
    dim = int(net.num_features)
    return SplitModel(net, nn.Linear(dim, num_classes), dim, num_classes)
