"""The LEAF / FedAvg next-character LSTM for Shakespeare (the FedAvg / FedProx / FedPer baselines of AdaptFED
Table 6).

McMahan et al. 2017 and LEAF (Caldas et al. 2018): an 8-d character embedding, a 2-layer LSTM of 256 units, a
dense layer on the last position's output; the sizes are those of the SHAKESPEARE_CONFIG in FedEM's / TransFed's
code (embed_size 8, hidden_size 256, n_layers 2, chunk_len 80). features(x) = the last LSTM output (B, hidden);
head = Linear(hidden, num_classes). Inputs are (B, T) token ids (dataset `shakespeare`).
"""

from __future__ import annotations

import torch
from torch import nn

from fedhet.models.base import SplitModel, no_pretrained, positive, register_model
from fedhet.models.focal_sequence import check_token_ids, sequence_length


class CharLSTMEncoder(nn.Module):
    """Token ids (B, T) -> the last LSTM output (B, hidden)."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_token_ids("char_lstm", x, self.vocab_size)
        out, _ = self.lstm(self.embed(x))
        result: torch.Tensor = out[:, -1]  # nn.Module calls are untyped in torch
        return result


@register_model("char_lstm")
def char_lstm_model(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    embed_dim: int = 8,
    hidden: int = 256,
    layers: int = 2,
    vocab_size: int | None = None,
) -> SplitModel:
    """Embedding(vocab, 8) -> LSTM(8, 256, 2 layers) -> last output -> Linear head (LEAF's Shakespeare model).
    `vocab_size` defaults to num_classes (inputs and labels share the character ids)."""
    no_pretrained("char_lstm", pretrained)
    sequence_length("char_lstm", input_shape)
    for name, value in (("embed_dim", embed_dim), ("hidden", hidden), ("layers", layers)):
        positive("char_lstm", name, value)
    vocab = positive("char_lstm", "vocab_size", num_classes if vocab_size is None else vocab_size)
    return SplitModel(CharLSTMEncoder(vocab, embed_dim, hidden, layers), nn.Linear(hidden, num_classes), hidden,
                      num_classes)
