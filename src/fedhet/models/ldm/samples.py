"""Sample grids of an LDM: what it generates for each (domain, class) prompt (docs/fedbip.md "Pretraining the
small LDM"; spec fedbip.md §7.1 item 1: "sample grids in docs").

Each cell is made by FedBiP's own server path, `generate` (Eq. 5, PNDM with classifier-free guidance against the
"" prompt): the prompt's concept vectors are the real words' token embeddings (`init_concepts(init="words")`
with one slot per word piece, so τ_θ(S, V) equals τ_θ of the written prompt), σ = 0 (no domain perturbation),
and the start latents z(T) are fresh N(0, I) noise. A grid has one block per domain: a header row with the class
words, then `per_prompt` rows of samples, one column per class. Written atomically as PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from tqdm.auto import tqdm

from fedhet.atomic import atomic_write
from fedhet.models.ldm.client import FedBiPUpload
from fedhet.models.ldm.components import LDMComponents
from fedhet.models.ldm.concepts import init_concepts
from fedhet.models.ldm.generate import GenerationConfig, generate
from fedhet.models.ldm.pretrain_config import SampleSettings
from fedhet.models.ldm.prompts import PromptEncoder

HEADER, LABEL, CHAR = 16, 72, 6  # header row height, domain label column width, approximate character width (px)


def word_pieces(parts: LDMComponents, word: str) -> int:
    """How many tokens the tokenizer makes of `word` (the slot size that holds it exactly)."""
    return len(parts.tokenizer(word, add_special_tokens=False)["input_ids"])


def prompt_samples(parts: LDMComponents, template: str, domain: str, word: str, settings: SampleSettings,
                   generator: torch.Generator) -> torch.Tensor:
    """`settings.per_prompt` images (n, C, H, W) in [0, 1] for the prompt `template` with `domain` and `word`."""
    encoder = PromptEncoder(parts, template, n_domain=word_pieces(parts, domain), n_class=word_pieces(parts, word))
    concepts = init_concepts(encoder, 1, generator, "words", domain, [word])
    side = parts.unet.config.sample_size
    h, w = (side, side) if isinstance(side, int) else tuple(side)
    n = settings.per_prompt
    start = torch.randn(n, parts.latent_channels, h, w, generator=generator)
    upload = FedBiPUpload(start, torch.zeros(n, dtype=torch.long), concepts.domain, concepts.classes)
    config = GenerationConfig(steps=settings.steps, guidance_scale=settings.guidance, domain_noise=0.0)
    images, _ = generate(encoder, upload, config, generator)
    return images


def sample_blocks(parts: LDMComponents, template: str, sources: Sequence[tuple[str, Sequence[str]]],
                  settings: SampleSettings, seed: int = 0, progress: bool = False
                  ) -> list[tuple[str, list[str], torch.Tensor]]:
    """[(domain, class words, images (C, n, 3, H, W))] for every (domain, class) prompt, seeded; `progress`: a
    bar over the prompts."""
    generator = torch.Generator().manual_seed(seed)
    bar = tqdm(total=sum(len(words) for _, words in sources), disable=not progress, unit="prompt", desc="samples")
    blocks = []
    for domain, words in sources:
        images = []
        for word in words:
            images.append(prompt_samples(parts, template, domain, word, settings, generator))
            bar.update()
        blocks.append((domain, list(words), torch.stack(images)))
    bar.close()
    return blocks


def _to_pil(image: torch.Tensor, scale: int) -> Image.Image:
    """(3, H, W) in [0, 1] -> a PIL image upscaled `scale` times (nearest, so pixels stay visible)."""
    array = (image.clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    pil = Image.fromarray(array)
    return pil.resize((pil.width * scale, pil.height * scale), Image.Resampling.NEAREST)


def render_grid(blocks: Sequence[tuple[str, list[str], torch.Tensor]], scale: int | None = None) -> Image.Image:
    """One PIL image: per block a header with the class words, then its samples (rows) × classes (columns);
    images upscaled `scale` times (default: to about 64 pixels)."""
    h, w = blocks[0][2].shape[-2:]
    scale = scale or max(1, 64 // max(h, w))
    cell_h, cell_w = h * scale, w * scale
    cols = max(len(words) for _, words, _ in blocks)
    height = sum(HEADER + images.shape[1] * cell_h for _, _, images in blocks)
    canvas = Image.new("RGB", (LABEL + cols * cell_w, height), "white")
    draw, font, top = ImageDraw.Draw(canvas), ImageFont.load_default(size=11), 0
    for domain, words, images in blocks:
        draw.text((2, top + 2), domain[: LABEL // CHAR], fill="black", font=font)
        for c, word in enumerate(words):
            draw.text((LABEL + c * cell_w + 2, top + 2), word[: max(1, cell_w // CHAR)], fill="black", font=font)
        top += HEADER
        for r in range(images.shape[1]):
            for c in range(images.shape[0]):
                canvas.paste(_to_pil(images[c, r], scale), (LABEL + c * cell_w, top + r * cell_h))
        top += images.shape[1] * cell_h
    return canvas


def write_sample_grid(parts: LDMComponents, template: str, sources: Sequence[tuple[str, Sequence[str]]],
                      settings: SampleSettings, path: str | Path, seed: int = 0, progress: bool = False) -> Path:
    """Generate the grid (`sample_blocks`) and write it to `path` as PNG, atomically."""
    grid = render_grid(sample_blocks(parts, template, sources, settings, seed, progress))
    return atomic_write(path, lambda tmp: grid.save(tmp, format="PNG"))
