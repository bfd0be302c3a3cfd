"""AdaptFED's hyperparameters (`AdaptFED.Params`) and their checks; what each choice means: fedhet.algorithms.adaptfed
and docs/adaptfed.md."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedhet.errors import ConfigError, unknown_choice
from fedhet.models.hypernet_update import HyperUpdateConfig

GENERATORS = ("hypernet", "local")
DESCRIPTORS = ("none", "label_histogram")


@dataclass
class AdaptFEDParams:
    """personalize: which parameters are P (param_partition selectors, or "all"); generator: "hypernet" (AdaptFED)
    | "local" (Vanilla-T); the hypernetwork's size (embedding_dim, hidden_dim, n_hidden, rank); update: its VJP
    step (`HyperUpdateConfig`: lr, momentum, weight_decay, sign, weighting, weight_embedding, aggregation,
    embedding_update, max_grad_norm; e.g. method_args.update.sign=paper); descriptor: "label_histogram" = the
    task-aware embeddings (ours, spec §2.6): z_i is joined by g_psi(s_i), s_i the client's training label
    frequencies, sent in its replies; lora_rank: P = rank-r LoRA factors on the personalized layers, their
    weights frozen and never sent (ours, module docstring); local_head: "+FedPER" (Sec. 4.3.1, Table 7): the
    classification head stays on each client, out of xi; init_from_model: generated P starts near the model's
    initial P."""

    personalize: list[str] = field(default_factory=lambda: ["focal_modulation"])
    generator: str = "hypernet"
    embedding_dim: int = 32
    hidden_dim: int = 100
    n_hidden: int = 1
    rank: int | None = None
    lora_rank: int | None = None
    local_head: bool = False
    descriptor: str = "none"
    init_from_model: bool = True
    update: HyperUpdateConfig = field(default_factory=HyperUpdateConfig)

    def validate(self) -> None:
        if self.generator not in GENERATORS:
            raise unknown_choice("adaptfed generator", self.generator, GENERATORS)
        if self.descriptor not in DESCRIPTORS:
            raise unknown_choice("adaptfed descriptor", self.descriptor, DESCRIPTORS)
        if self.descriptor != "none" and self.generator == "local":
            raise ConfigError("adaptfed: a task descriptor conditions the hypernetwork; generator=local has none")
        if self.lora_rank is not None:
            if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 1:
                raise ConfigError(f"adaptfed: lora_rank must be an integer >= 1, got {self.lora_rank!r}")
            if self.rank is not None:
                raise ConfigError("adaptfed: choose one low-rank variant: rank factors the generated P (sent in "
                                  "full), lora_rank makes P LoRA factors (only they are sent); unset the other")
