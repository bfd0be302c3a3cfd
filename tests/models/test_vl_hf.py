"""HF backbones: a tiny random ViLT and the packaged MiniLM-L6, with adapters, LoRA and prompts unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhet.errors import ConfigError, FedhetError
from fedhet.models import build_model
from fedhet.models.hf_vilt import load_vilt, vilt_split_model, vilt_word_map
from fedhet.models.peft import (
    adapter_param_count,
    adapter_path,
    add_prompts,
    apply_lora,
    insert_adapters,
    mark_trainable,
    peft_parameters,
    set_adapter_path,
)
from fedhet.models.vl_common import WordPieceMap

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


def tiny_vilt() -> Any:
    torch.manual_seed(0)
    config = transformers.ViltConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, image_size=32, patch_size=8, vocab_size=100,
                                     max_position_embeddings=40)
    words = WordPieceMap.from_token_map(list(range(64)), cls_id=98, sep_id=99)
    return vilt_split_model(transformers.ViltModel(config), 13, words).eval()


def batch() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    q = torch.randint(2, 64, (3, 16), generator=g)
    q[:, 9:] = 0
    return [torch.randn(3, 3, 32, 32, generator=g), q]


def test_tiny_vilt_adapters_paths_and_counts() -> None:
    model = tiny_vilt()
    before = model(batch())
    assert before.shape == (3, 13)
    names = insert_adapters(model, reduction=16, init="torch")
    assert names == ["features.vilt.encoder.layer.0.output", "features.vilt.encoder.layer.1.output"]
    dat = mark_trainable(model, "dat")
    r = 32 // 16
    assert dat.communicated_count == 2 * (32 * r + r + r * 32 + 32) == 2 * adapter_param_count(32, 16) == 324
    assert dat.trainable_count == 2 * 324 + (32 * 13 + 13)
    shared = model(batch())
    with adapter_path(model, "dat"):
        assert not torch.allclose(model(batch()), shared, atol=1e-5)
    set_adapter_path(model, "none")
    torch.testing.assert_close(model(batch()), before, atol=1e-5, rtol=1e-5)


def test_tiny_vilt_lora_and_prompts() -> None:
    model = tiny_vilt()
    apply_lora(model, "qv", rank=4)
    assert peft_parameters(model, "lora").communicated_count == 2 * 2 * (32 * 4 + 4 * 32)
    before = model(batch())
    prompts = add_prompts(model)
    assert peft_parameters(model, "prompt").communicated_count == 20 * 32
    seen: list[torch.Tensor] = []
    model.features.vilt.encoder.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    after = model(batch())
    text_len = 16 + 2  # [CLS] 9 words [SEP] and 7 pads; ViLT's image part starts with its own image CLS
    assert seen[-1].shape[1] == text_len + 20 + 1 + 16
    torch.testing.assert_close(seen[-1][0, 1:11], prompts.text.detach())
    torch.testing.assert_close(seen[-1][2, text_len + 10: text_len + 20], prompts.visual.detach())
    assert not torch.allclose(after, before, atol=1e-5)


def test_vilt_load_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FedhetError, match="cannot load ViLT from .*hf download"):
        load_vilt(str(tmp_path / "no-such-vilt"), local_files_only=True)
    with pytest.raises(ConfigError, match="needs the vocabulary"):
        build_model("hf_vilt", 13, (3, 32, 32), source=str(tmp_path))
    assert vilt_word_map(token_map=[0, 100, 2001]).table[:, 0].tolist() == [0, 100, 2001]


def test_a_vilt_checkpoint_folder_loads_its_weights(tmp_path: Path) -> None:
    """A folder with weights given as the backbone loads them, model.pretrained or not (issue 37)."""
    saved = tiny_vilt().features.vilt
    saved.save_pretrained(tmp_path)
    built = build_model("hf_vilt", 13, (3, 32, 32), source=str(tmp_path), token_map=list(range(64)),
                        local_files_only=True)
    mine, theirs = built.features.vilt.state_dict(), saved.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_other_hf_encoders_take_adapters_and_lora() -> None:
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    with torch.device("meta"):
        bert = transformers.BertModel(transformers.BertConfig(**small))
        vit = transformers.ViTModel(transformers.ViTConfig(**small))
    assert insert_adapters(bert) == ["encoder.layer.0.output", "encoder.layer.1.output"]  # BertOutput, post-LN
    apply_lora(bert, "qk", rank=2)
    assert peft_parameters(bert, "adapter").communicated_count == 2 * adapter_param_count(32, 16)
    assert peft_parameters(bert, "lora").communicated_count == 2 * 2 * (32 * 2 + 2 * 32)
    with pytest.raises(ConfigError, match="no transformer blocks.*ViTMLP"):
        insert_adapters(vit)  # transformers 5's ViT: the FFN is `mlp` (fc1, fc2)
    assert len(insert_adapters(vit, "ViTMLP")) == 2  # d read from fc2
    apply_lora(vit, ["q_proj", "k_proj"], rank=2)
    assert peft_parameters(vit, "adapter").communicated_count == 2 * adapter_param_count(32, 16)


def minilm_words() -> list[str]:
    return ["<pad>", "<unk>", "what", "rectangle", "is", "blue", "there"]


def test_word_piece_map_compacts_pieces_and_places_sep() -> None:
    tok = transformers.AutoTokenizer.from_pretrained(str(_minilm_dir()), local_files_only=True)
    wm = WordPieceMap.from_words(minilm_words(), tok)
    ids, mask = wm(torch.tensor([[2, 3, 0, 0], [4, 0, 5, 1]]))
    piece = {w: tok(w, add_special_tokens=False)["input_ids"] for w in minilm_words()[2:]}
    assert len(piece["rectangle"]) == 2  # a multi-piece word
    first = [101, *piece["what"], *piece["rectangle"], 102]
    second = [101, *piece["is"], *piece["blue"], tok.unk_token_id, 102]  # the PAD between words is dropped
    assert ids.shape == (2, 4 * 2 + 2)
    assert ids[0].tolist() == first + [0] * (10 - len(first)) and mask[0].tolist() == [1] * 5 + [0] * 5
    assert ids[1].tolist() == second + [0] * (10 - len(second)) and int(mask[1].sum()) == 5
    with pytest.raises(FedhetError, match="word id out of range"):
        wm(torch.tensor([[7]]))


def _minilm_dir() -> Path:
    from fedhet.models.minilm_vl import minilm_path

    return minilm_path()


def test_minilm_loads_offline_and_takes_adapters() -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    model: Any = build_model("minilm_vl", 13, (3, 16, 16), pretrained=True, words=minilm_words())
    shipped = safetensors.load_file(str(_minilm_dir() / "model.safetensors"))
    key = next(k for k in shipped if k.endswith("embeddings.word_embeddings.weight"))
    assert torch.equal(model.features.bert.embeddings.word_embeddings.weight, shipped[key])  # real weights
    q = torch.tensor([[2, 3, 0, 0], [4, 6, 5, 0]])
    x = [torch.randn(2, 3, 16, 16), q]
    assert model.eval()(x).shape == (2, 13) and model.feature_dim == 384
    assert len(insert_adapters(model)) == 6
    sel = mark_trainable(model, "adapter", also_train=["patch_embeddings.*", "image_position"])
    assert sel.communicated_count == 6 * adapter_param_count(384, 16) == 113_040
    new = 3 * 8 * 8 * 384 + 384 + 4 * 384  # the image projection: trained locally, not sent
    assert sel.trainable_count == 113_040 + new + (384 * 13 + 13)
    add_prompts(model)
    assert model(x).shape == (2, 13)


def test_the_datas_vocabulary_reaches_a_model_that_takes_words() -> None:
    """easy-VQA's words reach `words=` of minilm_vl without a config key; an explicit `words` wins."""
    from fedhet.config import load_config
    from fedhet.data import build_federated_data
    from fedhet.data.easy_vqa import EASY_VQA_VOCAB
    from fedhet.engine.experiment import make_model_fn

    cfg = load_config(None, ["data.dataset=easy_vqa_task", "model.name=minilm_vl", "data.max_test_per_client=4"])
    data = build_federated_data(cfg.data, cfg.seed)
    assert data.vocabulary == list(EASY_VQA_VOCAB)
    model: Any = make_model_fn(cfg, data)()
    tok = transformers.AutoTokenizer.from_pretrained(str(_minilm_dir()), local_files_only=True)
    table = model.features.words.table
    assert table.shape[0] == len(EASY_VQA_VOCAB)
    shape = EASY_VQA_VOCAB.index("shape")
    assert table[shape, 0].item() == tok("shape", add_special_tokens=False)["input_ids"][0]
    mine = build_model("minilm_vl", 13, (3, 16, 16), vocabulary=EASY_VQA_VOCAB, words=minilm_words())
    assert mine.features.words.table.shape[0] == len(minilm_words())
    with pytest.raises(FedhetError, match="needs the vocabulary"):
        build_model("minilm_vl", 13, (3, 16, 16))
