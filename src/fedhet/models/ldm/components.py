"""The frozen latent-diffusion model FedBiP shares between clients and server (spec fedbip.md §1.2-§1.3).

`LDMComponents` holds the VAE (ℰ, 𝒟: diffusers `AutoencoderKL`), the cross-attention UNet ϵ_θ
(`UNet2DConditionModel`), the text encoder τ_θ with its tokenizer (transformers: CLIPTextModel for Stable
Diffusion, BertModel for the packaged MiniLM-L6), and the two schedulers: DDPM for training-time noising
(Eq. 1, Eq. 4) and PNDM for generation (App. A: "PNDM"). θ is frozen throughout FedBiP (§4.2: "we finetune
only the textual guidance"): construction checks the parts fit together and sets requires_grad False and eval
mode on all three networks.

Checks (each a FedhetError naming the mismatch): UNet in/out channels = VAE latent channels (ϵ has the latent's
shape); UNet cross-attention dim = text encoder hidden size (τ_θ's states are the UNet's context); the tokenizer's
ids fit the text encoder's vocabulary; no SDXL-style added conditioning (its extra inputs are not built here).

`SD_SCHEDULER` is Stable Diffusion v1-4's scheduler config ([external], spec §6): T = 1000, scaled-linear betas
0.00085 -> 0.012, PNDM with skip_prk_steps and steps_offset 1; tiny test models and the small LDM pretrained
here use it so that ᾱ_T matches SD's (≈ 0.0047).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedhet.errors import FedhetError
from fedhet.models.ldm.deps import import_diffusers, quiet_diffusers

SD_SCHEDULER: dict[str, Any] = {  # Any: scheduler config values
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "skip_prk_steps": True,
    "set_alpha_to_one": False,
    "steps_offset": 1,
    "clip_sample": False,
    "prediction_type": "epsilon",
}
SPACINGS = ("leading", "trailing", "linspace")


@dataclass
class LDMComponents:
    """The frozen LDM θ: vae (AutoencoderKL), unet (UNet2DConditionModel), text_encoder + tokenizer
    (transformers), the DDPM training scheduler and the PNDM sampling scheduler (a template: `sampler()` gives
    a fresh one per batch, PNDM keeps state across steps). `max_length`: the longest prompt in tokens."""

    vae: Any  # Any: untyped diffusers/transformers
    unet: Any  # Any: untyped diffusers/transformers
    text_encoder: Any  # Any: untyped diffusers/transformers
    tokenizer: Any  # Any: untyped diffusers/transformers
    train_scheduler: Any  # Any: untyped diffusers/transformers
    sample_scheduler: Any  # Any: untyped diffusers/transformers
    max_length: int

    def __post_init__(self) -> None:
        check_compatible(self.vae, self.unet, self.text_encoder, self.tokenizer)
        for net in (self.vae, self.unet, self.text_encoder):
            net.requires_grad_(False)
            net.eval()

    @property
    def latent_channels(self) -> int:
        """c of the latent z(0) ∈ ℝ^{h×w×c} (SD: 4)."""
        return int(self.vae.config.latent_channels)

    @property
    def vae_factor(self) -> int:
        """Image side / latent side (SD: 8): one downsampling per VAE block after the first."""
        return int(2 ** (len(self.vae.config.block_out_channels) - 1))

    @property
    def unet_factor(self) -> int:
        """What the latent side must be divisible by for the UNet's down/up path to line up."""
        return int(2 ** (len(self.unet.config.block_out_channels) - 1))

    @property
    def num_train_timesteps(self) -> int:
        """T (SD: 1000); diffusers indexes timesteps 0..T-1, the paper 1..T."""
        return int(self.train_scheduler.config.num_train_timesteps)

    @property
    def text_dim(self) -> int:
        """Hidden size of τ_θ's output states (= the UNet's cross-attention dim)."""
        return int(self.text_encoder.config.hidden_size)

    @property
    def token_dim(self) -> int:
        """d_w: the dimension of τ_θ's input token embeddings (§4.2.2)."""
        return int(self.text_encoder.get_input_embeddings().weight.shape[1])

    @property
    def text_uses_mask(self) -> bool:
        """Whether τ_θ gets the padding mask: not for CLIP (Stable Diffusion encodes prompts without one)."""
        return str(self.text_encoder.config.model_type) != "clip_text_model"

    @property
    def device(self) -> torch.device:
        """The UNet's device (all parts are moved together by `to`)."""
        return torch.device(self.unet.device)

    @property
    def dtype(self) -> torch.dtype:
        """The UNet's dtype."""
        return self.unet.dtype  # type: ignore[no-any-return]

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> LDMComponents:
        """Move the three networks (in place) and return self."""
        for net in (self.vae, self.unet, self.text_encoder):
            if dtype is None:  # diffusers warns on any explicit dtype cast
                net.to(device)
            else:
                net.to(device, dtype)
        return self

    def sampler(self, spacing: str | None = None) -> Any:  # Any: untyped diffusers/transformers
        """A fresh PNDM scheduler with the template's config; `spacing` overrides its timestep_spacing
        ("leading": SD's default, first step t = 981 of 999 for 50 steps; "trailing": starts at t = T - 1)."""
        if spacing is not None and spacing not in SPACINGS:
            raise FedhetError(f"unknown timestep spacing '{spacing}'; valid: {', '.join(SPACINGS)}")
        extra = {} if spacing is None else {"timestep_spacing": spacing}
        diffusers = import_diffusers("FedBiP generation")
        with quiet_diffusers(diffusers):
            return diffusers.PNDMScheduler.from_config(self.sample_scheduler.config, **extra)


def assemble(vae: Any, unet: Any, text_encoder: Any, tokenizer: Any,  # Any: untyped diffusers/transformers
             scheduler_config: dict[str, Any] | None = None) -> LDMComponents:  # Any: untyped diffusers/transformers
    """Frozen LDMComponents from loose parts; schedulers from `scheduler_config` (default SD_SCHEDULER). E.g.
    the small LDM pretrained here: `assemble(vae, unet, *minilm_text_encoder())`."""
    train, sample = make_schedulers(dict(SD_SCHEDULER if scheduler_config is None else scheduler_config))
    return LDMComponents(vae=vae, unet=unet, text_encoder=text_encoder, tokenizer=tokenizer, train_scheduler=train,
                         sample_scheduler=sample, max_length=prompt_limit(tokenizer, text_encoder))


def make_schedulers(config: dict[str, Any]) -> tuple[Any, Any]:  # Any: untyped diffusers/transformers
    """(DDPMScheduler, PNDMScheduler) built from one scheduler config (e.g. SD_SCHEDULER or a checkpoint's)."""
    diffusers = import_diffusers("the FedBiP schedulers")
    with quiet_diffusers(diffusers):
        return diffusers.DDPMScheduler.from_config(config), diffusers.PNDMScheduler.from_config(config)


def check_compatible(vae: Any, unet: Any, text_encoder: Any, tokenizer: Any) -> None:  # Any: untyped third-party
    """A FedhetError when the VAE, UNet, text encoder and tokenizer do not fit together."""
    latent, unet_cfg = int(vae.config.latent_channels), unet.config
    if int(unet_cfg.in_channels) != latent or int(unet_cfg.out_channels) != latent:
        raise FedhetError(f"the UNet takes {unet_cfg.in_channels} and predicts {unet_cfg.out_channels} channels, "
                          f"but the VAE's latents have {latent}: the checkpoint's unet/ and vae/ do not match")
    hidden = int(text_encoder.config.hidden_size)
    if unet_cfg.cross_attention_dim != hidden:
        raise FedhetError(f"the UNet's cross-attention dim is {unet_cfg.cross_attention_dim}, but the text "
                          f"encoder's hidden size is {hidden}: the checkpoint's unet/ and text_encoder/ do not match")
    if getattr(unet_cfg, "addition_embed_type", None) is not None:
        raise FedhetError(f"UNets with added conditioning (addition_embed_type="
                          f"'{unet_cfg.addition_embed_type}', e.g. SDXL) are not supported: use an SD v1/v2-style "
                          "checkpoint")
    vocab = int(text_encoder.get_input_embeddings().weight.shape[0])
    if len(tokenizer) > vocab:
        raise FedhetError(f"the tokenizer has {len(tokenizer)} tokens but the text encoder embeds only {vocab}: "
                          "the checkpoint's tokenizer/ and text_encoder/ do not match")


def prompt_limit(tokenizer: Any, text_encoder: Any) -> int:  # Any: untyped diffusers/transformers
    """The longest prompt in tokens: the tokenizer's model_max_length capped by the encoder's positions."""
    positions = int(getattr(text_encoder.config, "max_position_embeddings", 10**6))
    return min(int(tokenizer.model_max_length), positions)
