"""Prompt tuning for single-stream VL encoders: learnable tokens at the input embeddings (App. A, PromptFL).

The paper prepends 10 visual and 10 textual tokens at the input embedding only. `add_prompts` attaches a
`PromptTokens` (`fedhet_prompts`) to a fedhet VL backbone (vl_transformer, hf_vilt, minilm_vl: any module
with `supports_prompts = True`), which splices them in with `splice_prompts`: the sequence becomes
[CLS] P_text question P_visual image, so [CLS] stays first (the pooled token). peft's PromptTuningConfig
only prepends virtual tokens to the text of an HF text model, so it cannot place the visual prompts.
Tokens start at N(0, std^2) with std = 0.02 (the paper is silent). `reparam=True` is the official code's prompt
baseline (HaokunChen245/FedDAT src/train/main.py lines 214-229): per modality, the tokens are the output of
Embedding(n, d) -> Linear(d, d/4) -> Tanh -> Linear(d/4, d) on the ids 0..n-1 (5 + 5 tokens; 0.60M parameters
sent at d = 768, every one of them trained and communicated), spliced at the same places.
"""

from __future__ import annotations

import torch
from torch import nn

from fedhet.errors import ConfigError

PROMPT_ATTR = "fedhet_prompts"


class PromptTokens(nn.Module):
    """`text` (n_text, d) and `visual` (n_visual, d) learnable prompt tokens."""

    def __init__(self, d: int, n_visual: int = 10, n_text: int = 10, std: float = 0.02,
                 device: torch.device | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if min(n_visual, n_text) < 0 or n_visual + n_text < 1:
            raise ConfigError(f"prompt token counts must be >= 0 and not both 0, got {n_visual}, {n_text}")
        self.text = nn.Parameter(torch.randn(n_text, d, device=device, dtype=dtype) * std)
        self.visual = nn.Parameter(torch.randn(n_visual, d, device=device, dtype=dtype) * std)

    def extra_repr(self) -> str:
        return f"n_text={self.text.shape[0]}, n_visual={self.visual.shape[0]}, d={self.text.shape[1]}"


class ReparamPrompts(nn.Module):
    """The official code's prompts: `text` / `visual` computed by Embedding -> Linear -> Tanh -> Linear nets."""

    def __init__(self, d: int, n_visual: int = 5, n_text: int = 5, device: torch.device | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if min(n_visual, n_text) < 1:
            raise ConfigError(f"reparameterised prompts need >= 1 token per modality, got {n_visual}, {n_text}")

        def net(n: int) -> nn.Sequential:
            return nn.Sequential(nn.Embedding(n, d), nn.Linear(d, max(d // 4, 1)), nn.Tanh(),
                                 nn.Linear(max(d // 4, 1), d)).to(device=device, dtype=dtype)

        self.text_net, self.visual_net = net(n_text), net(n_visual)

    @staticmethod
    def _tokens(net: nn.Sequential) -> torch.Tensor:
        embedding: nn.Embedding = net[0]  # type: ignore[assignment]
        # nn.Module calls are untyped in torch
        out: torch.Tensor = net(torch.arange(embedding.num_embeddings, device=embedding.weight.device))
        return out

    @property
    def text(self) -> torch.Tensor:
        return self._tokens(self.text_net)

    @property
    def visual(self) -> torch.Tensor:
        return self._tokens(self.visual_net)


AnyPrompts = PromptTokens | ReparamPrompts


def prompt_host(model: nn.Module) -> nn.Module:
    """The submodule of `model` that splices prompts in (`supports_prompts = True`); a ConfigError if none."""
    for module in model.modules():
        if getattr(module, "supports_prompts", False):
            return module
    raise ConfigError(f"{type(model).__name__} cannot host prompt tokens: use a fedhet VL backbone "
                      "(vl_transformer, hf_vilt, minilm_vl); peft's prompt tuning covers text-only HF models")


def add_prompts(model: nn.Module, n_visual: int = 10, n_text: int = 10, std: float = 0.02,
                reparam: bool = False) -> AnyPrompts:
    """Attach learnable prompt tokens (`reparam`: the official code's nets) to `model`'s VL backbone (global
    torch RNG) and return them."""
    host = prompt_host(model)
    if getattr(host, PROMPT_ATTR, None) is not None:
        raise ConfigError("the model already has prompt tokens; add them once")
    ref = next(host.parameters())
    d: int = host.hidden_size  # type: ignore[assignment]  # a prompt host declares an int hidden_size
    prompts: AnyPrompts = (ReparamPrompts(int(d), n_visual, n_text, ref.device, ref.dtype) if reparam
                           else PromptTokens(int(d), n_visual, n_text, std, ref.device, ref.dtype))
    host.add_module(PROMPT_ATTR, prompts)
    return prompts


def prompts_of(host: nn.Module) -> AnyPrompts | None:
    """The prompt tokens attached to `host`, or None."""
    found = getattr(host, PROMPT_ATTR, None)
    return found if isinstance(found, PromptTokens | ReparamPrompts) else None


def splice_prompts(prompts: AnyPrompts | None, text: torch.Tensor, text_mask: torch.Tensor,
                   image: torch.Tensor, image_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[text[:, :1], P_text, text[:, 1:], P_visual, image] and its mask (prompts always attended).

    text (B, Lt, d), image (B, Li, d); masks (B, L*) of 0/1 or bools, returned as `text_mask`'s dtype.
    """
    if prompts is None:
        return torch.cat([text, image], 1), torch.cat([text_mask, image_mask.to(text_mask.dtype)], 1)
    b = text.shape[0]
    p_t = prompts.text.unsqueeze(0).expand(b, -1, -1).to(text.dtype)
    p_v = prompts.visual.unsqueeze(0).expand(b, -1, -1).to(image.dtype)
    ones_t = text_mask.new_ones(b, p_t.shape[1])
    ones_v = text_mask.new_ones(b, p_v.shape[1])
    seq = torch.cat([text[:, :1], p_t, text[:, 1:], p_v, image], 1)
    mask = torch.cat([text_mask[:, :1], ones_t, text_mask[:, 1:], ones_v, image_mask.to(text_mask.dtype)], 1)
    return seq, mask
