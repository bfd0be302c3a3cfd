"""FedBiP's latent-diffusion foundation (Chen et al., "FedBiP: Heterogeneous One-Shot Federated Learning with
Personalized Latent Diffusion Models"; spec fedbip.md; docs/fedbip.md), on diffusers, the `ldm` extra.

- components / checkpoint / tiny: the frozen LDM θ (VAE, cross-attention UNet, text encoder + tokenizer, DDPM and
  PNDM schedulers) from a diffusers checkpoint folder, from loose parts (e.g. the packaged MiniLM-L6 text
  encoder), or tiny and random for tests;
- latents: ℰ / 𝒟 with image checks; prompts: templates, slot positions and the two injection modes;
- concepts: S and V (init, Eq. 4 loss, learning); client: γ, same-class partners, δ(T, ·), the upload;
- generate: Ŝ = S + η and PNDM (+ classifier-free guidance) denoising from the uploaded z(T) (Eq. 5).
diffusers is imported only when a function needs it.
"""

from fedhet.models.ldm.checkpoint import load_components, minilm_text_encoder, save_components
from fedhet.models.ldm.client import (
    FedBiPUpload,
    client_update,
    instance_latents,
    interpolate,
    noise_to_max_timestep,
    same_class_partners,
    sample_gamma,
)
from fedhet.models.ldm.components import SD_SCHEDULER, LDMComponents, assemble
from fedhet.models.ldm.concepts import ConceptConfig, Concepts, concept_loss, init_concepts, learn_concepts
from fedhet.models.ldm.generate import GenerationConfig, denoise, generate, perturb_domain
from fedhet.models.ldm.latents import decode_latents, encode_images
from fedhet.models.ldm.prompts import PAPER_TEMPLATE, TABLE5_TEMPLATE, PromptEncoder, PromptLayout, build_layout
from fedhet.models.ldm.tiny import tiny_components

__all__ = [
    "PAPER_TEMPLATE",
    "SD_SCHEDULER",
    "TABLE5_TEMPLATE",
    "ConceptConfig",
    "Concepts",
    "FedBiPUpload",
    "GenerationConfig",
    "LDMComponents",
    "PromptEncoder",
    "PromptLayout",
    "assemble",
    "build_layout",
    "client_update",
    "concept_loss",
    "decode_latents",
    "denoise",
    "encode_images",
    "generate",
    "init_concepts",
    "instance_latents",
    "interpolate",
    "learn_concepts",
    "load_components",
    "minilm_text_encoder",
    "noise_to_max_timestep",
    "perturb_domain",
    "same_class_partners",
    "sample_gamma",
    "save_components",
    "tiny_components",
]
