"""FedDEO (Yang et al., ACM MM 2024, "FedDEO: Description-Enhanced One-Shot Federated Learning with Diffusion
Models"), the one-shot baseline of FedBiP's Tables 1-2 ("the optimized category descriptions are uploaded and guide
pretrained diffusion models"; spec fedbip.md, baselines), on FedBiP's frozen LDM, conditioning and server
(fedhet.algorithms.fedbip, via FGL's prompt-only upload and generation). Read with the official code
(MingzhaoYang/FedDEO: generate_images.py, textmodel.py); the paper's text is not in shared/papers.

Client, once: one description per category, V_c (the class slot's `n_class` vectors of the prompt), starts from
the encoded class prompt (`init: words`; official: the `descriptor` starts from the text encoder's output for
"an image of <class>", so `mode: output`) and descends the LDM's denoising loss on the client's images of that
class with the LDM frozen (FedBiP's Eq. 4 with only V learned; official: MSE(ε, ε_θ(z_t, t, d_c)), SGD lr 10, one
pass over the images one at a time: `concept_optimizer` sgd, `concept_lr` 10, `concept_epochs` 1,
`concept_batch_size` 1). Up go the labels and the descriptions (and the domain slot's word vectors, unlearned, as
FGL's caption); no latent, no image. Server: `multiplier` images per local image (FedBiP-L's count: "the total
number of synthetic images is identical to FedBiP-L", FedBiP §5.1), each denoised from fresh N(0, I) under the
client's description of its class, then the classifier trains on them only.

**Simplified** (labelled): the official description is the whole 77-token conditioning sequence; here it is the
class slot of the template (`n_class` vectors), the other positions being the template's words. The official
sampler mixes two conditions, ε_u + 3 (ε_text − ε_u) + 3 (ε_desc − ε_u); here one condition (the description)
with FedBiP's classifier-free guidance (`guidance_scale`). The official count is a fixed number of images per
class per client (30); here `multiplier` per uploaded label.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fedhet.algorithms.fedbip import FedBiPWork
from fedhet.algorithms.fedbip_params import FedBiPParams
from fedhet.algorithms.fgl import FGL, FGLParams
from fedhet.algorithms.registry import register
from fedhet.core.contract import LocalPass
from fedhet.errors import ConfigError

OPTIMIZERS = ("sgd", "adam")


@dataclass
class FedDEOParams(FGLParams):
    """FedBiP's settings with only the class descriptions learned (`personalize` [V], required), from the class
    prompt (`init` words) at the encoder's output (`mode` output), by the official code's optimizer
    (`concept_optimizer` sgd | adam, `concept_lr` 10, `concept_epochs` 1, `concept_batch_size` 1) and no
    perturbation on the server (`domain_noise` 0)."""

    personalize: list[str] = field(default_factory=lambda: ["V"])
    init: str = "words"
    mode: str = "output"
    concept_optimizer: str = "sgd"
    concept_lr: float = 10.0
    concept_epochs: int = 1
    concept_batch_size: int = 1
    domain_noise: float = 0.0

    def validate(self) -> None:
        if self.personalize != ["V"]:
            raise ConfigError(f"feddeo method_args.personalize must be [V] (FedDEO uploads category descriptions, "
                              f"no latent and no domain vector), got {self.personalize}")
        if self.concept_optimizer not in OPTIMIZERS:
            raise ConfigError(f"feddeo method_args.concept_optimizer must be one of {list(OPTIMIZERS)}, got "
                              f"'{self.concept_optimizer}'")
        FedBiPParams.validate(self)  # FGL's own check (nothing personalized) is the one rule FedDEO changes


@register
class FedDEO(FGL):
    """Per-category descriptions up once; the server generates from fresh noise under them."""

    name = "feddeo"
    Params = FedDEOParams
    params: FedDEOParams  # FGL's and FedBiP's hooks read it as their Params, of which FedDEOParams is a subclass

    def passes(self, work: FedBiPWork) -> list[LocalPass]:
        """FedBiP's concept pass on V alone, with the description optimizer (`concept_optimizer`)."""
        kind = self.params.concept_optimizer
        return [dataclasses.replace(lp, optimizers={k: dataclasses.replace(o, kind=kind)
                                                    for k, o in lp.optimizers.items()})
                for lp in super().passes(work)]
