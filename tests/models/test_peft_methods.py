"""What each PEFT method trains and communicates, counted by hand on a tiny vl_transformer (FedDAT App. A)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from fedhet.errors import ConfigError
from fedhet.models import build_model
from fedhet.models.peft import (
    add_prompts,
    apply_lora,
    format_count,
    insert_adapters,
    lora_targets,
    mark_trainable,
    peft_parameters,
)

# d = 16, 2 blocks, mlp hidden 32, vocab 10, question_len 4, 3x16x16 images (4 patches of 8x8), 5 classes
EMBEDDINGS = 10 * 16 + 16 + 5 * 16 + (3 * 8 * 8 * 16 + 16) + 4 * 16 + 2 * 16  # word, cls, pos, conv, pos, type
BLOCK = 32 + 3 * (16 * 16 + 16) + (16 * 16 + 16) + 32 + (16 * 32 + 32) + (32 * 16 + 16)  # LN, qkv, out, LN, ffn
HEAD = 16 * 5 + 5
BACKBONE = EMBEDDINGS + 2 * BLOCK + 32  # + final LN
BIASES = 16 + 2 * (16 + 3 * 16 + 16 + 16 + 32 + 16) + 16  # conv; per block LN, qkv, out, LN, ffn x2; final LN
ADAPTER = 2 * (16 * 4 + 4 + 4 * 16 + 16)  # reduction 4 -> r = 4, one per block


def tiny() -> Any:
    torch.manual_seed(0)
    return build_model("vl_transformer", 5, (3, 16, 16), d=16, depth=2, heads=2, patch=8, mlp_ratio=2.0,
                       vocab_size=10, question_len=4)


def batch() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(2, 3, 16, 16, generator=g), torch.randint(1, 10, (2, 4), generator=g)]


def n_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_hand_count_of_the_backbone() -> None:
    model = tiny()
    assert sum(p.numel() for p in model.parameters()) == BACKBONE + HEAD == 8005
    full = peft_parameters(model, "full")
    assert (full.trainable_count, full.communicated_count, full.backbone_count) == (BACKBONE + HEAD, BACKBONE,
                                                                                 BACKBONE + HEAD)
    assert peft_parameters(model, "full", head_communicated=True).communicated_count == BACKBONE + HEAD


def test_clf_trains_the_head_only() -> None:
    model = tiny()
    sel = mark_trainable(model, "clf")
    assert n_trainable(model) == sel.trainable_count == HEAD and sel.communicated_count == 0
    assert sel.trainable == ("head.weight", "head.bias")


def test_bias_tuning_trains_every_backbone_bias_and_the_head() -> None:
    model = tiny()
    sel = mark_trainable(model, "bias")
    assert sel.communicated_count == BIASES == 320 and n_trainable(model) == BIASES + HEAD
    assert "features.encoder.layer.0.layernorm_before.bias" in sel.communicated  # LayerNorm biases count too
    assert "head.bias" not in sel.communicated


def test_adapter_and_dat_counts() -> None:
    model = tiny()
    insert_adapters(model, reduction=4)
    adapter = mark_trainable(model, "adapter")
    assert (adapter.communicated_count, n_trainable(model)) == (ADAPTER, ADAPTER + HEAD)
    dat = mark_trainable(model, "dat")
    assert (dat.communicated_count, n_trainable(model)) == (ADAPTER, 2 * ADAPTER + HEAD)  # A_s + A_c; Â_s frozen
    assert all(".slots.shared." in n for n in dat.communicated)
    full = mark_trainable(model, "full")
    assert full.backbone_count == BACKBONE + HEAD and not any("frozen_shared" in n for n in full.trainable)
    assert adapter.overhead == pytest.approx(ADAPTER / (BACKBONE + HEAD))


def test_lora_on_query_key_or_query_value() -> None:
    qk = tiny()
    assert apply_lora(qk, "qk", rank=2) == 2
    sel = mark_trainable(qk, "lora")
    assert sel.communicated_count == 2 * 2 * (16 * 2 + 2 * 16) and n_trainable(qk) == 256 + HEAD
    assert any(".key.lora_A" in n for n in sel.communicated) and not any(".value." in n for n in sel.communicated)
    qv = tiny()
    apply_lora(qv, "qv", reduction=8)  # r = d / 8 = 2
    names = peft_parameters(qv, "lora").communicated
    assert any(".value.lora_B" in n for n in names) and not any(".key." in n for n in names)
    qk.eval()
    torch.testing.assert_close(qk(batch()), tiny().eval()(batch()))  # B = 0: LoRA starts as the identity


def test_lora_bad_inputs() -> None:
    assert lora_targets(["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="letters of 'qkv'"):
        apply_lora(tiny(), "qx")
    with pytest.raises(ConfigError, match="rank must be a positive integer"):
        apply_lora(tiny(), rank=0)
    with pytest.raises(ConfigError, match=r"reduction 5 needs one hidden size it divides, got \[16\]"):
        apply_lora(tiny(), reduction=5)
    with pytest.raises(ConfigError, match=r"LoRA targets \['q_proj'\] not found.*VLSelfAttention"):
        apply_lora(tiny(), ["q_proj"])


def test_prompt_tuning_counts_and_placement() -> None:
    model = tiny()
    model.eval()
    before = model(batch())
    prompts = add_prompts(model, n_visual=10, n_text=10)
    sel = mark_trainable(model, "prompt")
    assert sel.communicated_count == 20 * 16 and n_trainable(model) == 320 + HEAD
    seen: list[torch.Tensor] = []
    model.features.encoder.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    assert not torch.allclose(model(batch()), before)
    seq = seen[-1]  # [CLS] P_text(10) words(4) P_visual(10) patches(4)
    assert seq.shape[1] == 1 + 10 + 4 + 10 + 4
    cls = model.features.embeddings.cls_token[0, 0] + model.features.embeddings.text_position[0, 0] + \
        model.features.embeddings.token_type_embeddings.weight[0]
    torch.testing.assert_close(seq[0, 0], cls.detach())
    torch.testing.assert_close(seq[0, 1:11], prompts.text.detach())
    torch.testing.assert_close(seq[1, 15:25], prompts.visual.detach())
    with pytest.raises(ConfigError, match="already has prompt tokens"):
        add_prompts(model)
    with pytest.raises(ConfigError, match="cannot host prompt tokens"):
        add_prompts(nn.Sequential(nn.Linear(2, 2)))


def test_kinds_need_their_modules() -> None:
    with pytest.raises(ConfigError, match="unknown PEFT kind 'adapters'"):
        peft_parameters(tiny(), "adapters")
    with pytest.raises(ConfigError, match=r"needs its modules.*apply_lora"):
        peft_parameters(tiny(), "lora")
    model = tiny()
    insert_adapters(model, reduction=4, dual=False)
    with pytest.raises(ConfigError, match=r"dual=True"):
        peft_parameters(model, "dat")


def test_vilt_base_counts_match_the_paper() -> None:
    """ViLT-B (12 blocks, d = 768) on the meta device: adapters 0.89M, LoRA r = 16 on q,k 0.60M, biases 0.10M."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    with torch.device("meta"):
        vilt = transformers.ViltModel(transformers.ViltConfig())
    insert_adapters(vilt)
    apply_lora(vilt, "qk", rank=16)
    assert peft_parameters(vilt, "adapter").communicated_count == 894_528
    assert peft_parameters(vilt, "lora").communicated_count == 589_824
    assert format_count(peft_parameters(vilt, "bias").communicated_count) == "0.10M"
    assert format_count(894_528) == "0.89M" and format_count(320) == "320"
