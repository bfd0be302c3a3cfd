"""The causal focal-modulation sequence model (our design) and the LEAF character LSTM: causality (a later
character never changes an earlier position), the partition presets pick exactly each block's f / h (/ proj),
integer-id inputs only."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhet.errors import ConfigError, FedhetError
from fedhet.models import build_model, split_parameters

torch.set_num_threads(1)


def tiny(**args: Any) -> Any:
    torch.manual_seed(0)
    return build_model("focal_sequence", 11, (12,), embed_dim=8, depth=2, **args)


@pytest.mark.parametrize("changed", [0, 5, 11])
def test_a_later_character_never_changes_an_earlier_position(changed: int) -> None:
    model = tiny()
    x = torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[:, changed] = (y[:, changed] + 1) % 11
    with torch.no_grad():
        a, b = model.features.sequence(x), model.features.sequence(y)
    assert torch.equal(a[:, :changed], b[:, :changed])  # symmetric padding or a full-mean context breaks this
    assert not torch.allclose(a[:, changed:], b[:, changed:])  # ... and later positions do see it


def test_prediction_on_a_prefix_is_that_position_of_the_whole_window() -> None:
    model = tiny(focal_level=3)
    x = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = model.head(model.features.sequence(x))
        for t in (0, 4, 11):
            assert torch.allclose(model(x[:, :t + 1]), whole[:, t], atol=1e-5)


def test_the_focal_modulation_preset_picks_exactly_f_and_h_of_every_block() -> None:
    model = tiny()
    blocks = range(2)
    part = split_parameters(model, "focal_modulation")
    assert set(part.p) == {f"features.blocks.{i}.modulation.{m}.{w}" for i in blocks for m in "fh"
                           for w in ("weight", "bias")}
    assert part.group_keys == tuple(f"features.blocks.{i}" for i in blocks)  # one hypernetwork head per block
    with_proj = split_parameters(model, "focal_modulation_proj")
    assert set(with_proj.p) - set(part.p) == {f"features.blocks.{i}.modulation.proj.{w}" for i in blocks
                                              for w in ("weight", "bias")}
    mlp = split_parameters(model, "mlp")
    assert mlp.p and all(".mlp." in n for n in mlp.p)


@pytest.mark.parametrize("name", ["focal_sequence", "char_lstm"])
def test_token_id_inputs_only(name: str) -> None:
    model = build_model(name, 11, (12,))
    assert model(torch.randint(0, 11, (2, 12))).shape == (2, 11)
    with pytest.raises(FedhetError, match="integer token ids"):
        model(torch.rand(2, 12))
    with pytest.raises(FedhetError, match="vocab_size"):
        model(torch.full((2, 12), 11))
    with pytest.raises(ConfigError, match="token-id sequences"):
        build_model(name, 11, (3, 28, 28))


def test_char_lstm_has_leafs_sizes() -> None:
    model: Any = build_model("char_lstm", 101, (80,))
    lstm = model.features.lstm
    assert (model.features.embed.embedding_dim, lstm.hidden_size, lstm.num_layers) == (8, 256, 2)
    assert model.feature_dim == 256
