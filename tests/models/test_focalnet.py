"""The timm FocalNet backbone (`focalnet`) and the P / xi parameter partition (AdaptFED spec §2.5, §7a.1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("timm")

from fedhet.errors import ConfigError, FedhetError  # noqa: E402
from fedhet.models import SplitModel, build_model, split_parameters  # noqa: E402
from fedhet.models.param_partition import PRESETS  # noqa: E402

FOCAL_PRESETS = sorted(set(PRESETS) - {"attention_qkv"})  # attention_qkv is the ViT's (tests/models/test_vit.py)

# a tiny two-stage FocalNet: stage 0 width 8 (1 block, focal level 2), stage 1 width 16 (2 blocks, level 3)
TINY: dict[str, Any] = {"embed_dim": 8, "depths": [1, 2], "focal_level": [2, 3], "patch_size": 4}


def tiny(c: int = 1, side: int = 28) -> Any:
    torch.manual_seed(0)
    return build_model("focalnet", 10, (c, side, side), **TINY)


def conv1x1(cin: int, cout: int) -> int:
    return cin * cout + cout


@pytest.mark.parametrize(("c", "side"), [(1, 28), (3, 32), (1, 32), (3, 28)])
def test_forward_shapes(c: int, side: int) -> None:
    model = tiny(c, side)
    x = torch.randn(2, c, side, side)
    assert isinstance(model, SplitModel) and model.feature_dim == 16  # embed_dim * 2^(stages-1)
    assert model.features(x).shape == (2, 16)
    assert model(x).shape == (2, 10)
    assert model.features.stem.proj.in_channels == c


def test_default_config_forward() -> None:
    torch.manual_seed(0)
    model: Any = build_model("focalnet", 10, (1, 28, 28))
    blocks = model.features.layers[0].blocks
    assert len(model.features.layers) == 1 and len(blocks) == 8  # the paper's 8 focal-modulation blocks
    assert model.feature_dim == 32 and model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_patch_size_sets_the_stem_stride_and_the_minimum_side() -> None:
    model: Any = build_model("focalnet", 3, (1, 8, 8), embed_dim=8, depths=[1, 1, 1], patch_size=2)
    assert model.features.stem.proj.stride == (2, 2)
    assert model(torch.randn(1, 1, 8, 8)).shape == (1, 3)
    with pytest.raises(ConfigError, match=r"at least 16x16.*got 8x8"):
        build_model("focalnet", 3, (1, 8, 8), embed_dim=8, depths=[1, 1, 1], patch_size=4)
    model = build_model("focalnet", 3, (1, 16, 16), embed_dim=8, depths=[1, 1, 1])
    assert model.features.stem.proj.stride == (4, 4)


@pytest.mark.parametrize(("args", "match"), [
    ({"depths": []}, "at least one stage"),
    ({"depths": [1, 0]}, "depths must be a positive integer"),
    ({"focal_level": [2]}, "focal_level needs one value per stage"),
    ({"embed_dim": 0}, "embed_dim must be a positive integer"),
    ({"patch_size": 0}, "patch_size must be a positive integer"),
])
def test_bad_arguments(args: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_model("focalnet", 10, (1, 28, 28), **{**TINY, **args})


def test_bad_input_shape() -> None:
    with pytest.raises(ConfigError, match="needs an image input_shape"):
        build_model("focalnet", 10, (784,), **TINY)


def test_pretrained_needs_a_local_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="can be downloaded here; give checkpoint=PATH"):
        build_model("focalnet", 10, (3, 32, 32), pretrained=True, **TINY)
    source = tiny(3, 32)
    path = tmp_path / "focalnet.pt"
    torch.save(source.features.state_dict(), path)
    torch.manual_seed(1)
    loaded = build_model("focalnet", 10, (3, 32, 32), pretrained=True, checkpoint=str(path), **TINY)
    for (name, a), b in zip(source.features.state_dict().items(), loaded.features.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(FedhetError, match="does not fit this configuration"):
        build_model("focalnet", 10, (3, 32, 32), checkpoint=str(path), **{**TINY, "embed_dim": 12})
    with pytest.raises(FedhetError, match="cannot read checkpoint"):
        build_model("focalnet", 10, (3, 32, 32), checkpoint=str(tmp_path / "none.pt"), **TINY)


@pytest.mark.parametrize("model", ["focalnet", "vit"])
def test_missing_timm_names_the_extra(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    for name in ("timm", "timm.models", "timm.models.focalnet", "timm.models.vision_transformer"):
        monkeypatch.setitem(sys.modules, name, None)  # as if timm were not installed: importing it fails
    with pytest.raises(FedhetError, match=r"pip install 'fedhet\[vision\]'"):
        build_model(model, 10, (1, 28, 28))


def expected_counts(c_in: int = 1, patch: int = 4) -> dict[str, int]:
    """Each preset's parameter count for TINY, by hand from the configured dims (spec §2.5 layer shapes)."""
    stages = [(8, 2, 1), (16, 3, 2)]  # (width C, focal level L, blocks)
    fm = sum(n * (conv1x1(c, 2 * c + lv + 1) + conv1x1(c, c)) for c, lv, n in stages)  # f: C -> 2C+L+1; h
    proj = sum(n * conv1x1(c, c) for c, _, n in stages)
    mlp = sum(n * (conv1x1(c, 4 * c) + conv1x1(4 * c, c)) for c, _, n in stages)
    norm = 2 * 8 + 2 * 16 + sum(n * 2 * 2 * c for c, _, n in stages) + 2 * 16  # stem, downsample, blocks, final
    encoder = c_in * 8 * patch * patch + 8 + 2 * 8 + 8 * 16 * 4 + 16 + 2 * 16  # stem conv+norm, downsample
    return {"focal_modulation": fm, "focal_modulation_proj": fm + proj, "mlp": mlp, "norm": norm,
            "encoder": encoder}


@pytest.mark.parametrize("preset", FOCAL_PRESETS)
def test_preset_counts_by_hand(preset: str) -> None:
    model = tiny()
    split = split_parameters(model, preset)
    assert split.p_numel == expected_counts()[preset]
    assert sum(t.numel() for t in split.p_tensors(model).values()) == split.p_numel


def test_default_preset_selects_exactly_f_and_h() -> None:
    model = tiny()
    split = split_parameters(model)
    assert split.p_numel == 243 + 2 * 884  # stage 0: 171 + 72; stage 1: 612 + 272 per block
    assert {n.split("modulation.")[1] for n in split.p} == {"f.weight", "f.bias", "h.weight", "h.bias"}
    assert split.group_keys == ("features.layers.0.blocks.0", "features.layers.1.blocks.0",
                                "features.layers.1.blocks.1")
    assert all(len(g) == 4 for g in split.groups)
    assert split.shapes()["features.layers.1.blocks.0.modulation.f.weight"] == (36, 16, 1, 1)


@pytest.mark.parametrize("spec", [*FOCAL_PRESETS, "type:FocalModulation", ["mlp", "norm"], "*.fc2.*"])
def test_p_and_xi_are_disjoint_cover_all_and_keep_order(spec: str | list[str]) -> None:
    model = tiny()
    split = split_parameters(model, spec)
    names = [n for n, _ in model.named_parameters()]
    assert split.p and split.xi and not set(split.p) & set(split.xi)
    assert sorted(split.p + split.xi) == sorted(names)
    assert list(split.p) == [n for n in names if n in split.p]  # named_parameters order, stable
    assert [n for g in split.groups for n in g] == list(split.p)
    params = dict(model.named_parameters())
    assert split.p_shapes == tuple(params[n].shape for n in split.p)
    assert split_parameters(tiny(), spec) == split


def test_type_and_glob_selectors() -> None:
    model = tiny()
    by_type = split_parameters(model, "type:FocalModulation")
    # f, h, proj and the depthwise focal convs (kernel 2l + 3 at level l, no bias)
    depthwise = sum(n * c * sum((2 * lv + 3) ** 2 for lv in range(levels)) for c, levels, n in [(8, 2, 1),
                                                                                               (16, 3, 2)])
    assert by_type.p_numel == expected_counts()["focal_modulation_proj"] + depthwise
    glob = split_parameters(model, ["*.modulation.f.*", "*.modulation.h.*"])
    assert glob == split_parameters(model, "focal_modulation")
    by_norm_type = split_parameters(model, "type:LayerNorm")  # LayerNorm2d subclasses it
    assert by_norm_type.p == split_parameters(model, "norm").p
    mlp = build_model("mlp", 3, (5,), hidden=[4])
    assert split_parameters(mlp, "head.*").p == ("head.weight", "head.bias")


@pytest.mark.parametrize(("spec", "match"), [
    ("focal_modulaton", r"unknown parameter-partition preset 'focal_modulaton' \(did you mean 'focal_modulation'"),
    ("*.attn.qkv.*", r"matches no parameter of SplitModel .*valid: presets focal_modulation"),
    ("type:Attention", "matches no parameter"),
    ([], "at least one selector"),
])
def test_partition_errors(spec: str | list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        split_parameters(tiny(), spec)


def test_preset_matching_nothing_on_another_model() -> None:
    with pytest.raises(ConfigError, match="'focal_modulation' matches no parameter"):
        split_parameters(build_model("mlp", 3, (5,), hidden=[4]), "focal_modulation")
