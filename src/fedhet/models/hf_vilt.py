"""HF ViLT (`transformers` ViltModel, Kim et al. 2021) as a fedhet SplitModel on x = [images, questions].

For users with the weights: `load_vilt("dandelin/vilt-b32-mlm")` or a local folder (a ViltForQuestionAnswering
checkpoint such as "dandelin/vilt-b32-finetuned-vqa" loads too: its `vilt.*` weights). fedhet word ids become
ViLT token ids through a `WordPieceMap`, built from the data's vocabulary words and the checkpoint's tokenizer
(`words=`) or given directly (`token_map=`, one token id per word id). features(x) = ViLT's pooler output
(tanh(W h_[CLS])); head = Linear(hidden, num_classes). Images should be normalised as ViLT expects
(mean = std = 0.5) and have sides that are multiples of `patch_size` (position embeddings are interpolated).
Adapters (`insert_adapters`, target "auto" finds every `ViltOutput`), LoRA and prompts work unchanged.
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
from fedhet.models.vl_common import WordPieceMap, import_transformers, quiet_transformers, split_vl_input

DEFAULT_SOURCE = "dandelin/vilt-b32-mlm"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def has_weights(source: str) -> bool:
    """Whether `source` is a local checkpoint folder holding weights (not just a config)."""
    return Path(source).is_dir() and any((Path(source) / name).is_file() for name in WEIGHT_FILES)


def _load_error(what: str, source: str, e: Exception) -> FedhetError:
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return FedhetError(f"cannot load {what} from '{source}' ({reason}); fedhet does not download weights here: "
                       f"on a networked machine run `hf download {source} --local-dir DIR` and pass DIR")


def load_vilt(source: str = DEFAULT_SOURCE, *, pretrained: bool = True,
              local_files_only: bool = False) -> Any:  # Any: untyped transformers
    """A `ViltModel` from an HF name or local folder (weights; config only if not `pretrained`)."""
    transformers = import_transformers("model 'hf_vilt'")
    try:
        with quiet_transformers(transformers):
            if pretrained:
                return transformers.ViltModel.from_pretrained(source, local_files_only=local_files_only)
            config = transformers.ViltConfig.from_pretrained(source, local_files_only=local_files_only)
            return transformers.ViltModel(config)
    except (OSError, ValueError) as e:
        raise _load_error("ViLT", source, e) from e


def vilt_word_map(source: str | None = None, *, words: Sequence[str] = (), token_map: Sequence[int] = (),
                  cls_id: int = 101, sep_id: int = 102, max_len: int = 40, local_files_only: bool = False
                  ) -> WordPieceMap:
    """fedhet word ids -> ViLT (bert-base-uncased) ids: from `words` + `source`'s tokenizer, or `token_map`."""
    if token_map:
        return WordPieceMap.from_token_map(token_map, cls_id, sep_id, max_len=max_len)
    if not words:
        raise ConfigError("model 'hf_vilt' needs the vocabulary: words=[...] (word id order) or token_map=[...]")
    if source is None:
        raise ConfigError("model 'hf_vilt': words= needs a source with a tokenizer")
    transformers = import_transformers("model 'hf_vilt'")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)
    except (OSError, ValueError) as e:
        raise _load_error("the ViLT tokenizer", source, e) from e
    return WordPieceMap.from_words(words, tokenizer, max_len=max_len)


class HFViltFeatures(nn.Module):
    """x = [images, questions] -> ViLT pooled output (B, hidden); hosts prompt tokens (`add_prompts`)."""

    supports_prompts = True

    def __init__(self, vilt: Any, words: WordPieceMap) -> None:  # Any: untyped transformers
        super().__init__()
        self.vilt = vilt
        self.words = words
        self.hidden_size = int(vilt.config.hidden_size)
        self._text_len = 0
        vilt.embeddings.register_forward_hook(self._splice)

    def _splice(self, module: nn.Module, args: Any, output: Any) -> Any:  # Any: untyped transformers
        """Forward hook on ViltEmbeddings: insert the prompt tokens into (embeddings, mask)."""
        prompts = prompts_of(self)
        if prompts is None:
            return None
        emb, mask = output
        n = self._text_len
        return splice_prompts(prompts, emb[:, :n], mask[:, :n], emb[:, n:], mask[:, n:])

    def forward(self, x: list[torch.Tensor] | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, questions = split_vl_input(x)
        ids, mask = self.words(questions)
        self._text_len = ids.shape[1]
        pixel_mask = images.new_ones(images.shape[0], images.shape[2], images.shape[3], dtype=torch.long)
        out = self.vilt(input_ids=ids, attention_mask=mask, pixel_values=images, pixel_mask=pixel_mask)
        pooled = out.pooler_output
        # transformers' outputs are untyped
        result: torch.Tensor = pooled if pooled is not None else out.last_hidden_state[:, 0]
        return result


def vilt_split_model(vilt: Any, num_classes: int, words: WordPieceMap) -> SplitModel:  # Any: untyped transformers
    """Wrap a `ViltModel` (pretrained or a random `ViltConfig` one) as a SplitModel with a Linear head."""
    features = HFViltFeatures(vilt, words)
    head = nn.Linear(features.hidden_size, num_classes)
    return SplitModel(features, head, features.hidden_size, num_classes)


@register_model("hf_vilt")
def hf_vilt(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    source: str = DEFAULT_SOURCE,
    words: Sequence[str] = (),
    token_map: Sequence[int] = (),
    local_files_only: bool = False,
) -> SplitModel:
    """HF ViLT from `source`: a checkpoint folder with weights always loads them (issue 37: it used to be silently
    random unless model.pretrained=true); a hub name loads its weights with `model.pretrained=true`, else its
    config with random weights (as does a config-only folder)."""
    check_image_shape("hf_vilt", input_shape)
    word_map = vilt_word_map(source, words=words, token_map=token_map, local_files_only=local_files_only)
    vilt = load_vilt(source, pretrained=pretrained or has_weights(source), local_files_only=local_files_only)
    return vilt_split_model(vilt, num_classes, word_map)
