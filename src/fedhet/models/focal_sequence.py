"""A causal sequence variant of focal modulation for next-character prediction (our design; AdaptFED Table 6).

The AdaptFED / TransFed paper runs Shakespeare "with a sequence variant of the backbone" but gives none, so this
is ours (docs/models/focal_sequence.md). It transfers FocalNet's focal modulation (Yang et al. 2022, Eq. 1 of
the AdaptFED paper: y_i = tau(A(i, X), Q_i); spec §2.5) from 2-D maps to a left-to-right 1-D sequence:

    [q, ctx, g] = f(x)                      f = Linear(C, 2C + L + 1)   (timm FocalModulation.f)
    ctx_l = GELU(DWConv1d_l(ctx_{l-1}))     kernel k_l = focal_window + 2l, left padding k_l - 1 only (causal)
    ctx_{L+1} = GELU(cummean_t(ctx_L))      the "global" context: mean over positions <= t, not the full mean
    m = h(sum_{l<=L+1} g_l * ctx_l)         h = Linear(C, C)             (timm's 1x1 conv h)
    y = proj(q * m)                         proj = Linear(C, C)

so position t never sees a later character. Blocks are x <- x + FM(LN(x)), x <- x + MLP(LN(x)) as FocalNet's;
features(x) = LN(blocks(Embedding(x)))[:, -1] (the last position predicts the next character), head = Linear.
The submodules are named `f`, `h`, `proj` (in `blocks.<i>.modulation`) and `mlp`, so the partition presets
"focal_modulation" / "mlp" / "norm" of `fedhet.models.param_partition` select them. No position embedding:
the causal convolutions see relative order (FocalNet has none either).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.errors import ConfigError, FedhetError
from fedhet.models.base import SplitModel, no_pretrained, positive, register_model


class CausalFocalModulation(nn.Module):
    """Focal modulation over (B, T, C) sequences, causal in T (module docstring; timm FocalModulation's names)."""

    def __init__(self, dim: int, focal_level: int = 2, focal_window: int = 3, focal_factor: int = 2,
                 normalize_modulator: bool = False) -> None:
        super().__init__()
        self.dim, self.focal_level, self.normalize_modulator = dim, focal_level, normalize_modulator
        self.f = nn.Linear(dim, 2 * dim + focal_level + 1)
        self.kernel_sizes = tuple(focal_factor * k + focal_window for k in range(focal_level))
        self.focal_layers = nn.ModuleList(
            nn.Conv1d(dim, dim, k, groups=dim, bias=False) for k in self.kernel_sizes)
        self.h = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, ctx, gates = torch.split(self.f(x), [self.dim, self.dim, self.focal_level + 1], dim=-1)
        ctx = ctx.transpose(1, 2)  # (B, C, T)
        gates = gates.transpose(1, 2)  # (B, L + 1, T)
        ctx_all = torch.zeros_like(ctx)
        for level, (conv, k) in enumerate(zip(self.focal_layers, self.kernel_sizes, strict=True)):
            ctx = F.gelu(conv(F.pad(ctx, (k - 1, 0))))  # left padding only: position t sees t-k+1..t
            ctx_all = ctx_all + ctx * gates[:, level:level + 1]
        steps = torch.arange(1, ctx.shape[-1] + 1, device=ctx.device, dtype=ctx.dtype)
        ctx_global = F.gelu(ctx.cumsum(-1) / steps)  # causal mean over positions <= t
        ctx_all = ctx_all + ctx_global * gates[:, self.focal_level:]
        if self.normalize_modulator:
            ctx_all = ctx_all / (self.focal_level + 1)
        out: torch.Tensor = self.proj(q * self.h(ctx_all.transpose(1, 2)))  # nn.Module calls are untyped in torch
        return out


class FocalSequenceBlock(nn.Module):
    """x <- x + FM(LN(x)); x <- x + MLP(LN(x)) (FocalNet's block without layer scale / drop path)."""

    def __init__(self, dim: int, mlp_ratio: float, focal_level: int, focal_window: int,
                 normalize_modulator: bool) -> None:
        super().__init__()
        hidden = max(1, round(dim * mlp_ratio))
        self.norm1 = nn.LayerNorm(dim)
        self.modulation = CausalFocalModulation(dim, focal_level, focal_window,
                                                normalize_modulator=normalize_modulator)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.modulation(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))  # nn.Module calls are untyped in torch
        return out


class FocalSequenceEncoder(nn.Module):
    """Token ids (B, T) -> the last position's feature (B, C): Embedding, blocks, LayerNorm."""

    def __init__(self, vocab_size: int, dim: int, blocks: Sequence[FocalSequenceBlock]) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim)

    def sequence(self, x: torch.Tensor) -> torch.Tensor:
        """Every position's feature (B, T, C); position t depends on tokens 0..t only."""
        check_token_ids("focal_sequence", x, self.vocab_size)
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        out: torch.Tensor = self.norm(h)  # nn.Module calls are untyped in torch
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sequence(x)[:, -1]


def check_token_ids(model: str, x: torch.Tensor, vocab_size: int) -> None:
    """A FedhetError unless `x` holds integer token ids in [0, vocab_size)."""
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.dim() != 2:
        raise FedhetError(f"model '{model}' takes (batch, length) integer token ids, got {x.dtype} "
                          f"{tuple(x.shape)}; use a text dataset such as 'shakespeare'")
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise FedhetError(f"model '{model}': token ids must be in [0, {vocab_size}), got {int(x.min())}.."
                          f"{int(x.max())}; set model.args.vocab_size to the data's vocabulary size")


def sequence_length(model: str, input_shape: Sequence[int]) -> int:
    """The window length of a 1-D (T,) input shape; a ConfigError for image / feature shapes."""
    if len(input_shape) != 1:
        raise ConfigError(f"model '{model}' needs token-id sequences, input_shape (length,), got "
                          f"{tuple(input_shape)}; use a text dataset such as 'shakespeare'")
    return int(input_shape[0])


@register_model("focal_sequence")
def focal_sequence_model(
    num_classes: int,
    input_shape: tuple[int, ...],
    pretrained: bool = False,
    *,
    embed_dim: int = 64,
    depth: int = 4,
    focal_level: int = 2,
    focal_window: int = 3,
    mlp_ratio: float = 2.0,
    normalize_modulator: bool = False,
    vocab_size: int | None = None,
) -> SplitModel:
    """Causal focal-modulation encoder over token ids + Linear head on the last position (module docstring).

    `vocab_size` defaults to num_classes (next-character prediction: inputs and labels share the ids). The window
    of level l is focal_window + 2l; a position sees depth * sum_l (k_l - 1) earlier characters through the
    convolutions and all earlier ones through the causal mean.
    """
    no_pretrained("focal_sequence", pretrained)
    sequence_length("focal_sequence", input_shape)
    for name, value in (("embed_dim", embed_dim), ("depth", depth), ("focal_level", focal_level),
                        ("focal_window", focal_window)):
        positive("focal_sequence", name, value)
    vocab = positive("focal_sequence", "vocab_size", num_classes if vocab_size is None else vocab_size)
    if not mlp_ratio > 0:
        raise ConfigError(f"model 'focal_sequence': mlp_ratio must be > 0, got {mlp_ratio}")
    blocks = [FocalSequenceBlock(embed_dim, float(mlp_ratio), focal_level, focal_window, bool(normalize_modulator))
              for _ in range(depth)]
    return SplitModel(FocalSequenceEncoder(vocab, embed_dim, blocks), nn.Linear(embed_dim, num_classes),
                      embed_dim, num_classes)
