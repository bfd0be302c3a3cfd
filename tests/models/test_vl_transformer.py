"""The ViLT-shaped `vl_transformer`: shapes, padding, bad input, central pretraining and its checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedhet.errors import CheckpointError, ConfigError, FedhetError
from fedhet.models import build_model
from fedhet.models.peft import insert_adapters
from fedhet.models.vl_pretrain import backbone_state, evaluate_accuracy, load_backbone, pretrain, save_backbone

ARGS: dict[str, Any] = {"d": 16, "depth": 2, "heads": 2, "patch": 4, "mlp_ratio": 2.0, "vocab_size": 8,
                        "question_len": 4}


def tiny(**args: Any) -> Any:
    torch.manual_seed(0)
    return build_model("vl_transformer", 3, (1, 8, 8), **{**ARGS, **args})


def test_registered_split_model_on_images_and_questions() -> None:
    model: Any = build_model("vl_transformer", 13, (3, 32, 32))  # the defaults: d 128, 4 blocks, 8x8 patches
    x = [torch.randn(2, 3, 32, 32), torch.randint(0, 64, (2, 16))]
    u = model.features(x)
    assert u.shape == (2, 128) and model(x).shape == (2, 13) and model.feature_dim == 128
    assert len(model.features.encoder.layer) == 4
    assert model.features.embeddings.image_position.shape == (1, 16, 128)


def test_padding_words_are_not_attended() -> None:
    model = tiny().eval()
    q = torch.tensor([[2, 3, 0, 0]])
    x = [torch.randn(1, 1, 8, 8), q]
    before = model(x)
    with torch.no_grad():  # change what a padded position would contribute ([CLS] w0 w1 pad pad)
        model.features.embeddings.text_position[0, 3:].add_(torch.randn(2, 16))
    torch.testing.assert_close(model(x), before)
    with torch.no_grad():
        model.features.embeddings.text_position[0, 2].add_(torch.randn(16))  # word w1: attended
    assert not torch.allclose(model(x), before)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="patch 3 must divide the image size 8x8"):
        tiny(patch=3)
    with pytest.raises(ConfigError, match="heads 3 does not divide d 16"):
        tiny(heads=3)
    with pytest.raises(ConfigError, match="ships no weights"):
        build_model("vl_transformer", 3, (1, 8, 8), pretrained=True, **ARGS)
    with pytest.raises(ConfigError, match=r"needs an image input_shape \(C, H, W\)"):
        build_model("vl_transformer", 3, (16,))
    with pytest.raises(FedhetError, match=r"x = \[images, questions\]"):
        tiny()(torch.randn(2, 1, 8, 8))
    with pytest.raises(ConfigError, match="question length 6 exceeds question_len 4"):
        tiny()([torch.randn(1, 1, 8, 8), torch.ones(1, 6, dtype=torch.long)])


def toy_batches(n: int = 4, seed: int = 0) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """Answer = which of 3 words the question holds, or the image's brightest quadrant -- easy to learn."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        y = torch.randint(0, 3, (16,), generator=g)
        q = torch.zeros(16, 4, dtype=torch.long)
        q[:, 0] = 2 + y
        out.append(([torch.randn(16, 1, 8, 8, generator=g) * 0.1, q], y))
    return out


def test_pretrain_learns_and_the_checkpoint_round_trips(tmp_path: Path) -> None:
    model = tiny()
    data = toy_batches()
    before = evaluate_accuracy(model, data)
    result = pretrain(model, data, epochs=15, lr=3e-3)
    assert result.steps == 60 and result.epochs == 15
    assert evaluate_accuracy(model, data) == 1.0 > before
    insert_adapters(model, reduction=4)
    assert not any("fedhet_adapter" in k for k in backbone_state(model))
    path = tmp_path / "vl.pt"
    save_backbone(model, path, meta={"seed": 0})
    loaded: Any = build_model("vl_transformer", 3, (1, 8, 8), checkpoint=str(path), **ARGS)
    assert evaluate_accuracy(loaded, data) == 1.0  # head loaded too (same class count)
    other = tiny()
    assert load_backbone(other, path, head=False) == {"seed": 0}
    assert torch.equal(other.head.weight, tiny().head.weight)
    with pytest.raises(CheckpointError, match="different architecture"):
        load_backbone(tiny(depth=1), path)
    with pytest.raises(CheckpointError, match="no backbone checkpoint"):
        load_backbone(tiny(), tmp_path / "missing.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read backbone checkpoint"):
        load_backbone(tiny(), tmp_path / "bad.pt")


def test_pretrain_stops_after_max_seconds_and_trains_only_params() -> None:
    model = tiny()
    frozen = {k: v.clone() for k, v in model.features.state_dict().items()}
    result = pretrain(model, toy_batches(), epochs=50, max_seconds=0.0, params=model.head.parameters())
    assert result.steps == 1 and result.epochs == 1
    assert all(torch.equal(v, model.features.state_dict()[k]) for k, v in frozen.items())
    assert isinstance(model.head, nn.Linear)
