"""The timm ViT backbone (`vit`, FedTP-T of AdaptFED Table 2) and its 'attention_qkv' partition."""

from __future__ import annotations

import pytest
import torch

from fedhet.errors import ConfigError, FedhetError
from fedhet.models import build_model, split_parameters


def test_vit_forward_and_qkv_partition() -> None:
    torch.manual_seed(0)
    model = build_model("vit", num_classes=7, input_shape=(3, 32, 32), depth=3, embed_dim=16, num_heads=2)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    part = split_parameters(model, "attention_qkv")
    assert part.p == tuple(f"features.blocks.{i}.attn.qkv.weight" for i in range(3))  # bias-free, as FedTP
    assert all(s == (48, 16) for s in part.p_shapes)
    assert part.group_keys == tuple(f"features.blocks.{i}" for i in range(3))
    with_bias = build_model("vit", num_classes=7, input_shape=(3, 32, 32), depth=1, embed_dim=16, num_heads=2,
                            qkv_bias=True)
    assert split_parameters(with_bias, "attention_qkv").p == ("features.blocks.0.attn.qkv.weight",
                                                               "features.blocks.0.attn.qkv.bias")


def test_vit_bad_configuration_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="must divide"):
        build_model("vit", num_classes=2, input_shape=(1, 28, 28), patch_size=5)
    with pytest.raises(ConfigError, match="multiple of num_heads"):
        build_model("vit", num_classes=2, input_shape=(1, 28, 28), embed_dim=30, num_heads=4)
    with pytest.raises(ConfigError, match="checkpoint=PATH"):
        build_model("vit", num_classes=2, input_shape=(1, 28, 28), pretrained=True)
    small = build_model("vit", num_classes=2, input_shape=(1, 28, 28), depth=1)
    path = tmp_path / "vit.pt"
    torch.save(small.features.state_dict(), path)
    loaded = build_model("vit", num_classes=2, input_shape=(1, 28, 28), depth=1, checkpoint=str(path))
    assert torch.equal(loaded.features.blocks[0].attn.qkv.weight, small.features.blocks[0].attn.qkv.weight)
    with pytest.raises(FedhetError, match="same patch_size"):
        build_model("vit", num_classes=2, input_shape=(1, 28, 28), depth=2, checkpoint=str(path))
