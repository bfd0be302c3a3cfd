"""FGL (Zhang et al., 2023, "Federated generative learning with foundation models"), the one-shot baseline of
FedBiP's Tables 1-2 ("captions of client local images, extracted by BLIP-2, are uploaded and guide pretrained
LDM"; spec fedbip.md, baselines), on FedBiP's frozen LDM and server (fedhet.algorithms.fedbip).

Client, once: one caption per local image goes up (as its label and the caption's prompt vectors), nothing of the
image itself: no latent, no learned vector. Server: `multiplier` images per caption, each PNDM-denoised from fresh
N(0, I) under the caption's prompt, then the classifier trains on them only (FedBiP's `synthesize` and classifier).

**Simplified** (labelled): FGL captions every image with BLIP-2, which is not available here. Every image's
caption is the class-name template instead (`template`, default "a {domain} style of a {class}", with the
domain's word `domain_words` and the class name), so the captions of one class are identical. FGL generates 3,500
images per class and domain; here `multiplier` per local image (default 10, FedBiP-L's count). No perturbation of
the domain vector (`domain_noise` 0): FGL has none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from fedhet.algorithms.base import ArraySpec
from fedhet.algorithms.fedbip import FedBiP, FedBiPWork
from fedhet.algorithms.fedbip_params import FedBiPParams
from fedhet.algorithms.fedbip_parts import TimedGeneration
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientState, FitStats
from fedhet.core.messages import Message, Reply
from fedhet.errors import ConfigError


@dataclass
class FGLParams(FedBiPParams):
    """FedBiP's settings with nothing personalized (captions only) and no perturbation of the domain vector."""

    personalize: list[str] = field(default_factory=list)
    domain_noise: float = 0.0

    def validate(self) -> None:
        if self.personalize:
            raise ConfigError(f"fgl method_args.personalize must be [] (FGL uploads captions, not latents or "
                              f"learned vectors), got {self.personalize}")
        super().validate()


@register
class FGL(FedBiP):
    """Captions up once (class-name templates, no BLIP-2 here); the server generates from them alone."""

    name = "fgl"
    Params = FGLParams
    params: FGLParams  # FedBiP's hooks read it as FedBiPParams, of which FGLParams is a subclass

    def finish(self, work: FedBiPWork, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        """The captions: labels and the template's word vectors (S, V); FedBiP's latents are not sent."""
        msg, state = super().finish(work, state, stats)
        return Message(arrays={k: v for k, v in msg.arrays.items() if k != "latents"}, scalars=msg.scalars), state

    def reply_layout(self, broadcast: Message) -> dict[str, ArraySpec]:
        """y (-1,), S (n_s, d), V (C, n_v, d)."""
        return {k: v for k, v in super().reply_layout(broadcast).items() if k != "latents"}

    def synthetic_set(self, reply: Reply, seed: int, run: TimedGeneration
                      ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int], str]:
        """FedBiP's synthetic set without z(T): every image starts from fresh N(0, I) (the placeholder latents
        only give the count and shape; they are never read)."""
        parts = self.encoder().parts
        side = self.image_side() // parts.vae_factor
        n = len(reply.message.arrays["labels"])
        arrays = dict(reply.message.arrays, latents=torch.zeros(n, parts.latent_channels, side, side))
        full = dataclasses.replace(reply, message=Message(arrays=arrays, scalars=reply.message.scalars))
        return super().synthetic_set(full, seed, run)
