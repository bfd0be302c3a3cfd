"""A small Vision Transformer from `timm` as a fedhet SplitModel: FedTP-T's backbone (AdaptFED Table 2, spec §4).

FedTP (Li et al. 2023) and the TransFed code's `ViTHyper` generate each block's self-attention QKV projection
(`to_qkv.weight`, bias-free, vit-pytorch) with the hypernetwork; here the architecture is timm's
`VisionTransformer` with `qkv_bias=False` by default, so the partition preset "attention_qkv"
(`fedhet.models.param_partition`) selects exactly each block's `attn.qkv.weight`. features(x) = timm's forward
without classifier (mean-pooled tokens by default, `global_pool="token"` for the class token); head = Linear.

Defaults (ours, sized like `focalnet`'s for 28-32 px on CPU): patch 4, width 32, 8 blocks, 4 heads, MLP ratio 4.
No ViT weights can be downloaded here: `checkpoint=PATH` loads a local timm state dict of the same
configuration. Needs `pip install 'fedhet[vision]'` (timm).
"""

from __future__ import annotations

import torch
from torch import nn

from fedhet.errors import ConfigError, FedhetError
from fedhet.models.base import SplitModel, check_image_shape, register_model
from fedhet.models.focalnet import import_timm_module


def _load_checkpoint(net: nn.Module, path: str) -> None:
    """Load a local timm ViT state dict into `net` (its classifier dropped)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
        net.load_state_dict(state, strict=True)
    except Exception as e:
        raise FedhetError(f"model 'vit': checkpoint '{path}' cannot be loaded into this configuration ({e}); give "
                          "a local timm VisionTransformer state dict with the same patch_size, embed_dim, depth, "
                          "num_heads and qkv_bias") from e


@register_model("vit")
def vit_model(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    patch_size: int = 4,
    embed_dim: int = 32,
    depth: int = 8,
    num_heads: int = 4,
    mlp_ratio: float = 4.0,
    qkv_bias: bool = False,
    global_pool: str = "avg",
    checkpoint: str = "",
) -> SplitModel:
    """timm VisionTransformer features (B, embed_dim) + Linear head; the image side must be a multiple of
    patch_size and embed_dim a multiple of num_heads."""
    c, h, w = check_image_shape("vit", input_shape)
    if min(patch_size, embed_dim, depth, num_heads) < 1 or h % patch_size or w % patch_size:
        raise ConfigError(f"model 'vit': patch_size {patch_size} must divide the image side ({h}x{w}) and "
                          "patch_size, embed_dim, depth, num_heads must be positive")
    if embed_dim % num_heads:
        raise ConfigError(f"model 'vit': embed_dim {embed_dim} must be a multiple of num_heads {num_heads}")
    if global_pool not in ("avg", "token"):
        raise ConfigError(f"model 'vit': global_pool must be 'avg' or 'token', got {global_pool!r}")
    if pretrained and not checkpoint:
        raise ConfigError("model 'vit': no ViT weights can be downloaded here; give checkpoint=PATH (a local timm "
                          "state dict of the same configuration) or pretrained: false")
    vit = import_timm_module("vision_transformer", "model 'vit'")
    net = vit.VisionTransformer(
        img_size=(h, w), patch_size=patch_size, in_chans=c, num_classes=0, embed_dim=embed_dim, depth=depth,
        num_heads=num_heads, mlp_ratio=float(mlp_ratio), qkv_bias=bool(qkv_bias), global_pool=global_pool,
        class_token=global_pool == "token")
    if checkpoint:
        _load_checkpoint(net, checkpoint)
    return SplitModel(net, nn.Linear(embed_dim, num_classes), embed_dim, num_classes)
