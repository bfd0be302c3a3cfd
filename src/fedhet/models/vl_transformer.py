"""A small ViLT-shaped single-stream vision-language transformer (Kim et al. 2021), registered as `vl_transformer`.

Tokens: [CLS] + question words (word + position + token-type 0) and image patches (a conv patch embedding +
position + token-type 1), one sequence through pre-LN blocks laid out like HF ViLT, so the same adapter / LoRA
insertion code finds the same names:

    embeddings.{word_embeddings, cls_token, text_position, patch_embeddings, image_position, token_type_embeddings}
    encoder.layer[i].{layernorm_before, attention.attention.{query,key,value}, attention.output.dense,
                      layernorm_after, intermediate.dense, output.dense}      (`output` is a `VLOutput`)
    layernorm                                                                (u = LN(h)[CLS])

features(x) = the final LayerNorm's [CLS] state (B, d); head = Linear(d, num_classes). ViLT's tanh pooler is
left out: trained from scratch it saturated (features collapsed to +-1 on a toy task). Padding words (id 0)
are masked out of attention. It stands in for ViLT (no weights here): pretrain it centrally
(`fedhet.models.vl_pretrain`) and load the result with `checkpoint=PATH`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from fedhet.errors import ConfigError
from fedhet.models.base import SplitModel, check_image_shape, register_model
from fedhet.models.peft.prompt import prompts_of, splice_prompts
from fedhet.models.vl_common import split_vl_input


class VLEmbeddings(nn.Module):
    """Text tokens ([CLS] + words) and image patch tokens, each with position and token-type embeddings."""

    def __init__(self, d: int, vocab_size: int, question_len: int, channels: int, grid: tuple[int, int],
                 patch: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d, padding_idx=0)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.text_position = nn.Parameter(torch.zeros(1, question_len + 1, d))
        self.patch_embeddings = nn.Conv2d(channels, d, patch, stride=patch)
        self.image_position = nn.Parameter(torch.zeros(1, grid[0] * grid[1], d))
        self.token_type_embeddings = nn.Embedding(2, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, images: torch.Tensor, questions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(text (B, 1+L, d), text mask, image (B, N, d), image mask); masks are bool, True = attend."""
        b, length = questions.shape
        if length + 1 > self.text_position.shape[1]:
            raise ConfigError(f"question length {length} exceeds question_len {self.text_position.shape[1] - 1}")
        words = torch.cat([self.cls_token.expand(b, -1, -1), self.word_embeddings(questions)], 1)
        text = words + self.text_position[:, : length + 1] + self.token_type_embeddings.weight[0]
        image = self.patch_embeddings(images).flatten(2).transpose(1, 2)
        if image.shape[1] != self.image_position.shape[1]:
            raise ConfigError(f"image gives {image.shape[1]} patches, the model was built for "
                              f"{self.image_position.shape[1]}")
        image = image + self.image_position + self.token_type_embeddings.weight[1]
        text_mask = torch.cat([questions.new_ones(b, 1, dtype=torch.bool), questions != 0], 1)
        image_mask = text_mask.new_ones(b, image.shape[1])
        return self.dropout(text), text_mask, self.dropout(image), image_mask


class VLSelfAttention(nn.Module):
    """Multi-head attention with HF names `query`, `key`, `value` (the LoRA targets)."""

    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.p = heads, dropout
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = h.shape
        q, k, v = (lin(h).view(b, n, self.heads, d // self.heads).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :],
                                             dropout_p=self.p if self.training else 0.0)
        return out.transpose(1, 2).reshape(b, n, d)


class VLSelfOutput(nn.Module):
    """The attention output projection (the residual is added in `VLLayer`, as in ViLT)."""

    def __init__(self, d: int, dropout: float) -> None:
        super().__init__()
        self.dense, self.dropout = nn.Linear(d, d), nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.dropout(self.dense(h))  # nn.Module calls are untyped in torch
        return result


class VLAttention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.attention, self.output = VLSelfAttention(d, heads, dropout), VLSelfOutput(d, dropout)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.output(self.attention(h, mask))  # nn.Module calls are untyped in torch
        return result


class VLIntermediate(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.dense, self.act = nn.Linear(d, hidden), nn.GELU()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.dense(h))  # nn.Module calls are untyped in torch
        return out


class VLOutput(nn.Module):
    """FFN second projection + residual (like `ViltOutput`): its output is where the adapters go (Eq. 1)."""

    def __init__(self, hidden: int, d: int, dropout: float) -> None:
        super().__init__()
        self.dense, self.dropout = nn.Linear(hidden, d), nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.dropout(self.dense(h)) + input_tensor  # nn.Module calls are untyped in torch
        return result


class VLLayer(nn.Module):
    """A pre-LN block: h + Attn(LN(h)), then FFN output(intermediate(LN(h)), h)."""

    def __init__(self, d: int, heads: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.layernorm_before = nn.LayerNorm(d)
        self.attention = VLAttention(d, heads, dropout)
        self.layernorm_after = nn.LayerNorm(d)
        self.intermediate = VLIntermediate(d, hidden)
        self.output = VLOutput(hidden, d, dropout)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.layernorm_before(h), mask)
        # nn.Module calls are untyped in torch
        result: torch.Tensor = self.output(self.intermediate(self.layernorm_after(h)), h)
        return result


class VLEncoder(nn.Module):
    def __init__(self, depth: int, d: int, heads: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.ModuleList(VLLayer(d, heads, hidden, dropout) for _ in range(depth))

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for block in self.layer:
            h = block(h, mask)
        return h


class VLTransformerFeatures(nn.Module):
    """x = [images, questions] -> LN(h)[CLS] (B, d); hosts prompt tokens (`add_prompts`)."""

    supports_prompts = True

    def __init__(self, embeddings: VLEmbeddings, depth: int, heads: int, hidden: int, dropout: float) -> None:
        super().__init__()
        d = embeddings.cls_token.shape[-1]
        self.hidden_size = int(d)
        self.embeddings = embeddings
        self.encoder = VLEncoder(depth, d, heads, hidden, dropout)
        self.layernorm = nn.LayerNorm(d)

    def forward(self, x: list[torch.Tensor] | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        text, text_mask, image, image_mask = self.embeddings(*split_vl_input(x))
        h, mask = splice_prompts(prompts_of(self), text, text_mask, image, image_mask)
        out: torch.Tensor = self.layernorm(self.encoder(h, mask))[:, 0]  # nn.Module calls are untyped in torch
        return out


def init_weights(module: nn.Module) -> None:
    """ViLT/BERT-style init: N(0, 0.02) (truncated) for weights and position/CLS tokens, zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=0.02)
        if isinstance(m, (nn.Linear, nn.Conv2d)) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, VLEmbeddings):
            for p in (m.cls_token, m.text_position, m.image_position):
                nn.init.trunc_normal_(p, std=0.02)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()


def _check_args(d: int, depth: int, heads: int, patch: int, mlp_ratio: float, vocab_size: int,
                question_len: int, dropout: float) -> None:
    if min(d, depth, heads, patch, vocab_size, question_len) < 1 or mlp_ratio <= 0:
        raise ConfigError("model 'vl_transformer': d, depth, heads, patch, vocab_size, question_len and "
                          "mlp_ratio must be positive")
    if d % heads:
        raise ConfigError(f"model 'vl_transformer': heads {heads} does not divide d {d}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"model 'vl_transformer': dropout must be in [0, 1), got {dropout}")


@register_model("vl_transformer")
def vl_transformer(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    d: int = 128,
    depth: int = 4,
    heads: int = 4,
    patch: int = 8,
    mlp_ratio: float = 4.0,
    vocab_size: int = 64,
    question_len: int = 16,
    dropout: float = 0.0,
    checkpoint: str = "",
) -> SplitModel:
    """The ViLT-shaped backbone for image input_shape (C, H, W) (H, W multiples of `patch`); head Linear(d, C).

    `checkpoint`: a file from `vl_pretrain.save_backbone`, loaded into the features (its head too when the
    class count matches). pretrained=True without a checkpoint is a ConfigError (no weights ship).
    """
    c, h, w = check_image_shape("vl_transformer", input_shape, min_side=patch)
    _check_args(d, depth, heads, patch, mlp_ratio, vocab_size, question_len, dropout)
    if h % patch or w % patch:
        raise ConfigError(f"model 'vl_transformer': patch {patch} must divide the image size {h}x{w}")
    if pretrained and not checkpoint:
        raise ConfigError("model 'vl_transformer' ships no weights: pretrain it (fedhet.models.vl_pretrain) "
                          "and pass checkpoint=PATH")
    emb = VLEmbeddings(d, vocab_size, question_len, c, (h // patch, w // patch), patch, dropout)
    features = VLTransformerFeatures(emb, depth, heads, int(d * mlp_ratio), dropout)
    model = SplitModel(features, nn.Linear(d, num_classes), d, num_classes)
    init_weights(model)
    if checkpoint:
        from fedhet.models.vl_pretrain import load_backbone

        load_backbone(model, checkpoint)
    return model
