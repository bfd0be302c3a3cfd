"""Which parameters each PEFT method trains and communicates, and how many (the "Comm. Overhead" column).

Kinds (FedDAT Tables 2-3 and App. A); the head is the SplitModel's `head` (client-specific in the paper):

| kind    | trained on a client                 | communicated          |
|---------|-------------------------------------|-----------------------|
| clf     | head                                | nothing               |
| adapter | A_s + head                          | A_s                   |
| dat     | A_s + A_c + head (FedDAT)           | A_s                   |
| lora    | LoRA matrices + head                | LoRA matrices         |
| prompt  | prompt tokens + head                | prompt tokens         |
| bias    | backbone biases (BitFit) + head     | backbone biases       |
| full    | backbone + head                     | backbone              |

`head_communicated=True` adds the head to the communicated set (a shared head, e.g. full* with one answer
space). Â_s is never trainable. Parameters are told apart by name: adapters live under `fedhet_adapter.slots.*`,
LoRA under `lora_*` (peft), prompts under `fedhet_prompts.*`, the head under `head.`; the rest is the backbone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from fedhet.errors import ConfigError
from fedhet.models.peft.insertion import ADAPTER_ATTR, name_matches
from fedhet.models.peft.prompt import PROMPT_ATTR

KINDS = ("clf", "adapter", "dat", "lora", "prompt", "bias", "full")
_NEEDS = {"adapter": "adapter:shared", "dat": "adapter:client", "lora": "lora", "prompt": "prompt"}
_HINT = {"adapter:shared": "insert_adapters(model)", "adapter:client": "insert_adapters(model, dual=True)",
         "lora": "apply_lora(model)", "prompt": "add_prompts(model)"}


@dataclass(frozen=True)
class PeftParameters:
    """Names and counts for one method; `overhead` = communicated / backbone (Table 2's percentage)."""

    kind: str
    trainable: tuple[str, ...]
    communicated: tuple[str, ...]
    trainable_count: int
    communicated_count: int
    backbone_count: int

    @property
    def overhead(self) -> float:
        return self.communicated_count / self.backbone_count if self.backbone_count else 0.0


def param_group(name: str) -> str:
    """'adapter:<slot>', 'lora', 'prompt', 'head', 'bias' (a backbone bias) or 'backbone'."""
    marker = f"{ADAPTER_ATTR}.slots."
    if marker in name:
        return "adapter:" + name.split(marker, 1)[1].split(".", 1)[0]
    if "lora_" in name:
        return "lora"
    if f"{PROMPT_ATTR}." in name:
        return "prompt"
    if name.startswith("head."):
        return "head"
    return "bias" if name.rsplit(".", 1)[-1].endswith("bias") else "backbone"


def _sets(kind: str) -> tuple[set[str], set[str]]:
    """(groups trained, groups communicated) for `kind`, the head excluded."""
    table = {"clf": (set(), set()), "adapter": ({"adapter:shared"}, {"adapter:shared"}),
             "dat": ({"adapter:shared", "adapter:client"}, {"adapter:shared"}),
             "lora": ({"lora"}, {"lora"}), "prompt": ({"prompt"}, {"prompt"}), "bias": ({"bias"}, {"bias"}),
             "full": ({"bias", "backbone"}, {"bias", "backbone"})}
    return table[kind]


def peft_parameters(model: nn.Module, kind: str, *, head_trainable: bool = True, head_communicated: bool = False,
                    also_train: Sequence[str] = ()) -> PeftParameters:
    """The trained and communicated parameters of method `kind` on `model` (see the module table).

    `also_train`: name patterns (as adapter targets: `*` one name part) of extra locally trained, never
    communicated parameters, e.g. minilm_vl's new image projection "patch_embeddings.*". A ConfigError for an
    unknown kind, a model missing the kind's modules or an `also_train` pattern that matches no parameter.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown PEFT kind {kind!r}; valid: {', '.join(KINDS)}")
    named = list(model.named_parameters())
    groups = {n: param_group(n) for n, _ in named}
    need = _NEEDS.get(kind)
    if need is not None and need not in groups.values():
        raise ConfigError(f"PEFT kind {kind!r} needs its modules on {type(model).__name__}: call {_HINT[need]}")
    train, comm = _sets(kind)
    if head_trainable:
        train = train | {"head"}
    if head_communicated:
        train, comm = train | {"head"}, comm | {"head"}
    for pattern in also_train:
        if not any(name_matches(n, pattern) for n in groups):
            raise ConfigError(f"also_train pattern {pattern!r} matches no parameter of {type(model).__name__}; "
                              f"its parameters look like {', '.join(list(groups)[:3])}, ...")
    trained = [n for n, _ in named if groups[n] in train or any(name_matches(n, p) for p in also_train)]
    trained = [n for n in trained if groups[n] != "adapter:frozen_shared"]
    sent = [n for n, _ in named if groups[n] in comm]
    sizes = {n: p.numel() for n, p in named}
    backbone = sum(sizes[n] for n in sizes if groups[n] in ("bias", "backbone", "head"))
    return PeftParameters(kind, tuple(trained), tuple(sent), sum(sizes[n] for n in trained),
                          sum(sizes[n] for n in sent), backbone)


def mark_trainable(model: nn.Module, kind: str, *, head_trainable: bool = True, head_communicated: bool = False,
                   also_train: Sequence[str] = ()) -> PeftParameters:
    """Set requires_grad to True exactly on `peft_parameters(...).trainable`; returns that selection."""
    sel = peft_parameters(model, kind, head_trainable=head_trainable, head_communicated=head_communicated,
                          also_train=also_train)
    keep = set(sel.trainable)
    for name, p in model.named_parameters():
        p.requires_grad_(name in keep)
    return sel


def format_count(n: int) -> str:
    """A parameter count as the paper prints it: 894528 -> '0.89M', 15360 -> '15.4K'."""
    return f"{n / 1e6:.2f}M" if n >= 100_000 else f"{n / 1e3:.1f}K" if n >= 1000 else str(n)
