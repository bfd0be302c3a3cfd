"""The networks and training steps of the small LDM pretrained here (spec fedbip.md §1.2, §7.1 item 1;
docs/fedbip.md "Pretraining the small LDM"). `fedhet.launch.ldm_pretrain` runs them (cache, resume, budget).

Stage 1, the VAE ℰ/𝒟 (diffusers `AutoencoderKL`): images in [-1, 1], loss = mean |x − 𝒟(z)| + β · KL(q(z|x) ‖
N(0, I)) per latent element, z a posterior sample (LDM's first stage without the perceptual and GAN terms, which
a 32-pixel pool does not need). Grey pool images are recoloured (a random foreground and background colour) with
probability `color_augment`, so that ℰ/𝒟 also serve FedBiP clients with coloured images; the UNet never sees
the recoloured images. Then `scaling_factor` = 1 / std of the pool's latents (as Stable Diffusion's 0.18215 was
chosen), stored in the VAE's config, so z = ℰ(x) · scaling_factor has unit variance.

Stage 2, the UNet ϵ_θ (`UNet2DConditionModel`, cross_attention_dim = the text encoder's hidden size, 384 for
MiniLM-L6): Eq. 1's DDPM ε-prediction loss ‖ϵ − ϵ_θ(√ᾱ_t z + √(1−ᾱ_t) ϵ, t, τ_θ(prompt))‖², t ~ U{0..T−1} on
SD's schedule (SD_SCHEDULER), z a fresh posterior sample of each image's cached ℰ statistics. τ_θ is the frozen
MiniLM; its states for the pool's prompts are computed once (`prompt_contexts`). With probability `uncond_prob`
a sample's prompt is replaced by "" padded to that prompt's length, the unconditional input FedBiP's generation
uses for classifier-free guidance (`PromptEncoder.unconditional`). Prompts of different lengths are padded to the
batch's longest with a cross-attention mask; generation passes unpadded prompts of one length and no mask,
which is the same computation.
Every random draw of a step comes from the `generator` the caller passes (one per step, so a resumed run draws
the same numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fedhet.losses.descent import descend
from fedhet.models.ldm.deps import import_diffusers
from fedhet.models.ldm.pool import PoolPrompt
from fedhet.models.ldm.pretrain_config import LDMPretrainConfig
from fedhet.models.ldm.prompts import layout_of


def build_vae(cfg: LDMPretrainConfig) -> Any:  # Any: untyped diffusers/transformers
    """A random AutoencoderKL: 3-channel `image_size` images, one down block per entry of vae.blocks."""
    diffusers, v = import_diffusers("LDM pretraining"), cfg.vae
    n = len(v.blocks)
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=tuple(v.blocks), layers_per_block=v.layers_per_block,
        down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
        latent_channels=v.latent_channels, norm_num_groups=v.norm_groups, sample_size=cfg.image_size)


def build_unet(cfg: LDMPretrainConfig, text_dim: int) -> Any:  # Any: untyped diffusers/transformers
    """A random UNet2DConditionModel on the VAE's latents; cross-attention on every level but the deepest."""
    diffusers, u = import_diffusers("LDM pretraining"), cfg.unet
    n = len(u.blocks)
    down = ("CrossAttnDownBlock2D",) * (n - 1) + ("DownBlock2D",) if n > 1 else ("CrossAttnDownBlock2D",)
    up = ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n - 1) if n > 1 else ("CrossAttnUpBlock2D",)
    return diffusers.UNet2DConditionModel(
        sample_size=cfg.image_size // 2 ** (len(cfg.vae.blocks) - 1), in_channels=cfg.vae.latent_channels,
        out_channels=cfg.vae.latent_channels, block_out_channels=tuple(u.blocks), layers_per_block=u.layers_per_block,
        down_block_types=down, up_block_types=up, cross_attention_dim=text_dim, attention_head_dim=u.heads,
        norm_num_groups=u.norm_groups)


def color_augment(x: torch.Tensor, prob: float, generator: torch.Generator) -> torch.Tensor:
    """Images (B, 3, H, W) in [0, 1]; each one, with probability `prob`, redrawn as bg + (fg − bg) · grey with
    random RGB colours fg, bg ~ U[0, 1]³ (its grey level as the stroke)."""
    b = x.shape[0]
    fg, bg = torch.rand(b, 3, 1, 1, generator=generator), torch.rand(b, 3, 1, 1, generator=generator)
    use = torch.rand(b, 1, 1, 1, generator=generator) < prob
    return torch.where(use, bg + (fg - bg) * x.mean(1, keepdim=True), x)


def vae_step(vae: Any, opt: torch.optim.Optimizer, images: torch.Tensor,  # Any: untyped diffusers
             cfg: LDMPretrainConfig, generator: torch.Generator) -> float:
    """One VAE step on uint8 images (B, 3, S, S): recolour, L1 + β·KL, AdamW; returns the loss."""
    device = next(vae.parameters()).device
    x = color_augment(images.float() / 255, cfg.vae.color_augment, generator).to(device) * 2 - 1
    post = vae.encode(x).latent_dist
    draw = torch.randn(post.mean.shape, generator=generator).to(device)
    recon = vae.decode(post.mean + post.std * draw).sample
    loss = (recon - x).abs().mean() + cfg.vae.kl_weight * post.kl().mean() / post.mean[0].numel()
    descend(opt, loss, "ldm pretraining (vae)", "lower vae.lr")
    return float(loss.item())


@dataclass
class PromptContexts:
    """τ_θ states (2P, L, D) and cross-attention masks (2P, L): rows 0..P−1 the pool's P prompts, row P + p the
    "" prompt padded to prompt p's length (its unconditional twin)."""

    states: torch.Tensor
    mask: torch.Tensor

    def to(self, device: torch.device) -> PromptContexts:
        return PromptContexts(self.states.to(device), self.mask.to(device))


@torch.no_grad()
def prompt_contexts(text_encoder: Any, tokenizer: Any, template: str,  # Any: untyped transformers
                    prompts: Sequence[PoolPrompt], max_length: int) -> PromptContexts:
    """The frozen text encoder's states of every pool prompt and of its unconditional twin (class doc)."""
    uses_mask = str(text_encoder.config.model_type) != "clip_text_model"  # as PromptEncoder.run
    ids, masks = [], []
    for p in prompts:
        lay = layout_of(template, tokenizer, p.domain, p.word, max_length)
        ids.append(lay.input_ids)
        masks.append(lay.attention_mask)
    for length in [len(i) for i in ids]:
        tok = tokenizer("", padding="max_length", max_length=length, truncation=True, return_tensors="pt")
        ids.append(tok["input_ids"][0])
        masks.append(tok["attention_mask"][0])
    longest = max(len(i) for i in ids)
    states = torch.zeros(len(ids), longest, int(text_encoder.config.hidden_size))
    keep = torch.zeros(len(ids), longest, dtype=torch.bool)
    device = next(text_encoder.parameters()).device
    for row, (i, m) in enumerate(zip(ids, masks, strict=True)):
        out = text_encoder(input_ids=i[None].to(device), attention_mask=m[None].to(device) if uses_mask else None)[0]
        states[row, :len(i)] = out[0].float().cpu()
        keep[row, :len(i)] = True
    return PromptContexts(states, keep)


@torch.no_grad()
def encode_pool(vae: Any, images: torch.Tensor,  # Any: untyped diffusers
                batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """The posterior mean and std (N, c, h, w) of ℰ for uint8 images (N, 3, S, S), float32 on the VAE's device."""
    device, means, stds = next(vae.parameters()).device, [], []
    for chunk in images.split(batch_size):
        post = vae.encode(chunk.to(device).float() / 255 * 2 - 1).latent_dist
        means.append(post.mean.float())
        stds.append(post.std.float())
    return torch.cat(means), torch.cat(stds)


def latent_scale(mean: torch.Tensor, std: torch.Tensor) -> float:
    """1 / std of posterior samples over the pool: sqrt(Var[mean] + E[std²]) (LDM's rescaling)."""
    return float(1.0 / torch.sqrt(mean.double().var() + std.double().pow(2).mean()))


def sample_latents(mean: torch.Tensor, std: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """z = (mean + std · ϵ) · scale: a fresh posterior sample of cached ℰ statistics, scaled to unit variance."""
    return (mean + std * torch.randn(mean.shape, generator=generator).to(mean.device)) * scale


def unet_step(unet: Any, opt: torch.optim.Optimizer, scheduler: Any,  # Any: untyped diffusers
              z0: torch.Tensor, rows: torch.Tensor, contexts: PromptContexts, cfg: LDMPretrainConfig,
              generator: torch.Generator, lr: float) -> float:
    """One ε-prediction step on scaled latents z0 (B, c, h, w) whose prompt rows into `contexts` are `rows`:
    t and ϵ drawn, condition dropout, AdamW at `lr`, gradient clipping. Returns the loss."""
    n, device = len(rows), z0.device
    noise = torch.randn(z0.shape, generator=generator).to(device)
    t = torch.randint(0, int(scheduler.config.num_train_timesteps), (n,), generator=generator).to(device)
    drop = torch.rand(n, generator=generator) < cfg.unet.uncond_prob
    rows = (rows + drop.long() * (len(contexts.states) // 2)).to(device)
    pred = unet(scheduler.add_noise(z0, noise, t), t, encoder_hidden_states=contexts.states[rows],
                encoder_attention_mask=contexts.mask[rows]).sample
    loss = F.mse_loss(pred.float(), noise.float())
    for group in opt.param_groups:
        group["lr"] = lr
    descend(opt, loss, "ldm pretraining (unet)", "lower unet.lr", clip=(unet.parameters(), cfg.unet.grad_clip))
    return float(loss.item())


def warmup_lr(step: int, base: float, warmup: int) -> float:
    """base · min(1, (step + 1) / warmup): linear warmup, then constant (so a time budget may stop anywhere)."""
    return base * min(1.0, (step + 1) / warmup) if warmup > 0 else base


@torch.no_grad()
def ema_update(ema: dict[str, torch.Tensor], model: torch.nn.Module, decay: float, step: int) -> None:
    """ema ← d · ema + (1 − d) · θ with d = min(decay, (1 + step) / (10 + step)) (the usual EMA warmup)."""
    d = min(decay, (1 + step) / (10 + step))
    for name, p in model.named_parameters():
        ema[name].mul_(d).add_(p.detach(), alpha=1 - d)
