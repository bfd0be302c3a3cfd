"""FedBiP's `method_args` (the method: `fedhet.algorithms.fedbip`; what each switch means and how the paper and
the official code read it: docs/fedbip.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhet.algorithms.fedbip_parts import ImageFormat
from fedhet.errors import ConfigError, FedhetError
from fedhet.models.ldm.checkpoint import resolve_checkpoint
from fedhet.models.ldm.client import SINGLETONS, START_LATENTS
from fedhet.models.ldm.components import SPACINGS
from fedhet.models.ldm.concepts import INITS
from fedhet.models.ldm.generate import NOISE_PER, GenerationConfig
from fedhet.models.ldm.latents import POSTERIORS
from fedhet.models.ldm.prompts import MODES, PAPER_TEMPLATE, template_segments

COMPONENTS = ("zT", "S", "V")  # Table 3: instance latents, domain concept, class concepts
SIZES = {"S": 2, "M": 5, "L": 10}  # FedBiP-S / -M / -L: synthetic images per local image (§5.1)


@dataclass
class FedBiPParams:
    """The frozen LDM (`ldm`: a diffusers folder, or a hub name already in the local cache), its prompt
    (`template` with {domain} / {class}, `n_domain` / `n_class` slots, injection `mode` token | output), the
    concept learning (Eq. 4: `concept_epochs`, `concept_batch_size`, `concept_lr`, `init` random | words), the
    instance latents (`posterior`, `singleton`), what is personalized (`personalize`, Table 3), generation
    (`multiplier`, or `size` S / M / L, which when set replaces it, so a variant's size overrides a base
    config's multiplier; `steps`, `guidance_scale`, `domain_noise` σ, `noise_per`, `spacing`,
    `generation_batch_size`, `chunk` images per cache file, `cache` generated chunks in `cache_dir`, None: fedhet's
    cache folder),
    the classifier (`classifier_epochs`; optimizer, lr and batch size from `train`), the words of the
    unpersonalized slots (`domain_words`: domain -> word, default the domain's name; `class_words`: default the
    dataset's class names) and how the classifier's inputs are normalised (`normalize`, `mean`, `std`)."""

    ldm: str = ""
    template: str = PAPER_TEMPLATE
    n_domain: int = 1
    n_class: int = 1
    mode: str = "token"
    init: str = "random"
    concept_epochs: int = 30
    concept_batch_size: int = 8
    concept_lr: float = 0.1
    posterior: str = "sample"
    singleton: str = "self"
    start_latent: str = "fresh"
    personalize: list[str] = field(default_factory=lambda: list(COMPONENTS))
    size: str | None = None
    multiplier: int = 10
    steps: int = 50
    guidance_scale: float = 7.5
    domain_noise: float = 0.1
    noise_per: str = "image"
    spacing: str | None = None
    generation_batch_size: int = 32
    chunk: int = 64
    cache: bool = True
    cache_dir: str | None = None
    classifier_epochs: int = 50
    domain_words: dict[str, str] = field(default_factory=dict)
    class_words: list[str] = field(default_factory=list)
    normalize: str = "imagenet"
    mean: list[float] | None = None
    std: list[float] | None = None

    def validate(self) -> None:
        if not self.ldm:
            raise ConfigError("fedbip needs method_args.ldm: a diffusers checkpoint folder (e.g. one written by "
                              "`fedhet ldm pretrain --out DIR`, or Stable Diffusion v1-4)")
        if self.size is not None:
            if self.size not in SIZES:
                raise ConfigError(f"fedbip method_args.size must be one of {list(SIZES)}, got '{self.size}'")
            self.multiplier = SIZES[self.size]
        bad = [c for c in self.personalize if c not in COMPONENTS]
        choices = [("mode", self.mode, MODES), ("init", self.init, INITS), ("posterior", self.posterior, POSTERIORS),
                   ("singleton", self.singleton, SINGLETONS), ("start_latent", self.start_latent, START_LATENTS),
                   ("noise_per", self.noise_per, NOISE_PER),
                   ("spacing", self.spacing, (None, *SPACINGS))]
        checks = [(not bad, f"personalize takes a subset of {list(COMPONENTS)}, got {bad}"),
                  (self.n_domain >= 1 and self.n_class >= 1, "n_domain and n_class must be >= 1"),
                  (self.concept_epochs >= 0 and self.concept_batch_size >= 1 and self.concept_lr > 0,
                   "need concept_epochs >= 0, concept_batch_size >= 1 and concept_lr > 0"),
                  (self.multiplier >= 1 and self.chunk >= 1 and self.classifier_epochs >= 0,
                   "need multiplier >= 1, chunk >= 1 and classifier_epochs >= 0")]
        checks += [(value in valid, f"{name} must be one of {list(valid)}, got '{value}'") for name, value, valid
                   in choices]
        for ok, why in checks:
            if not ok:
                raise ConfigError(f"fedbip method_args: {why}")
        try:
            template_segments(self.template)
        except FedhetError as err:
            raise ConfigError(f"fedbip method_args.template: {err}") from err
        self.generation()
        self.image_format()
        try:  # before any data is loaded: a missing checkpoint is the most likely mistake
            resolve_checkpoint(self.ldm)
        except FedhetError as err:
            raise ConfigError(f"fedbip method_args.ldm: {err}") from err

    def generation(self) -> GenerationConfig:
        """The server's generation settings (fedhet.models.ldm.generate)."""
        try:
            return GenerationConfig(steps=self.steps, guidance_scale=self.guidance_scale,
                                    domain_noise=self.domain_noise, noise_per=self.noise_per,
                                    batch_size=self.generation_batch_size, spacing=self.spacing)
        except Exception as err:
            raise ConfigError(f"fedbip method_args: {err}") from err

    def image_format(self) -> ImageFormat:
        """How the classifier's inputs relate to [0, 1] images."""
        return ImageFormat.of(self.normalize, self.mean, self.std)


SERVER_SIDE = ("size", "multiplier", "steps", "guidance_scale", "domain_noise", "noise_per", "spacing",
               "generation_batch_size", "chunk", "cache", "cache_dir", "classifier_epochs")


def client_settings(params: FedBiPParams) -> tuple[tuple[str, object], ...]:
    """The settings a client's upload depends on (every field but the server's generation and classifier)."""
    return tuple((k, v) for k, v in sorted(vars(params).items()) if k not in SERVER_SIDE)
