"""LoRA on the attention projections through the `peft` library (Hu et al. 2021; FedDAT App. A).

The paper puts LoRA on W_q and W_k ("reduction factor 16"); the official code uses the `adapters` library's
default q,v: `projections="qk"` (default, the paper) or `"qv"`. The rank is ambiguous: "reduction factor 16" read
as r = d/16 gives 1.77M parameters for ViLT-B, while the printed 0.60M fits r = 16 (12 x 2 x 2 x 768 x 16 =
589,824), so `rank=16` is the default and `reduction=16` gives r = d/16. The scale s = alpha/r is not stated;
alpha defaults to r (s = 1, the `adapters` library default). Works on any module tree whose attention
projections are Linear layers named `query`/`key`/`value` (fedhet's vl_transformer, HF ViLT, BERT/MiniLM).

`fresh_base=True` is the official code's LoRA baseline (HaokunChen245/FedDAT src/modeling/viltbert.py lines
369-374, albef.py 120-135): each targeted projection is *replaced* by a new `loralib.Linear(d, d, r=16)`, whose
weight is a fresh nn.Linear draw, frozen (lora_alpha 1: scale 1/r), so the pretrained W_q / W_v are lost: a
degraded baseline. Here the pretrained base layer is re-drawn (nn.Linear's init) and frozen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fedhet.errors import ConfigError, FedhetError
from fedhet.models.peft.insertion import module_types

VLM_MISSING = "{what} needs the 'vlm' extra (transformers, peft): pip install 'fedhet[vlm]'"
PROJECTIONS = {"q": "query", "k": "key", "v": "value"}


def import_peft() -> Any:  # Any: untyped peft
    """The `peft` module, or a FedhetError naming the extra to install."""
    try:
        import peft
    except ImportError as e:
        raise FedhetError(VLM_MISSING.format(what="LoRA")) from e
    return peft


def lora_targets(projections: str | Sequence[str]) -> list[str]:
    """'qk' -> ['query', 'key']; a list of module names is kept as given."""
    if isinstance(projections, str):
        bad = [c for c in projections if c not in PROJECTIONS]
        if bad or not projections:
            raise ConfigError(f"LoRA projections must be letters of 'qkv' (e.g. 'qk', 'qv'), got {projections!r}")
        return [PROJECTIONS[c] for c in projections]
    return [str(n) for n in projections]


def _resolve_rank(model: nn.Module, names: list[str], rank: int, reduction: int | None) -> int:
    if reduction is None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ConfigError(f"LoRA rank must be a positive integer, got {rank!r}")
        return rank
    dims = {m.in_features for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in names}
    if len(dims) != 1 or next(iter(dims)) % reduction:
        raise ConfigError(f"LoRA reduction {reduction} needs one hidden size it divides, got {sorted(dims)}")
    return next(iter(dims)) // reduction


def apply_lora(model: nn.Module, projections: str | Sequence[str] = "qk", rank: int = 16,
               reduction: int | None = None, alpha: float | None = None, dropout: float = 0.0,
               fresh_base: bool = False) -> int:
    """Inject LoRA (peft `LoraConfig`, B = 0 at start) into the named projections in place; returns the rank.

    `reduction`, when given, replaces `rank`: r = d / reduction (d the projections' input size). `fresh_base`:
    re-draw the wrapped projections' frozen weights (the official code's degraded baseline, module doc).

    peft freezes every other parameter; use `mark_trainable(model, "lora")` to train the head too.
    """
    names = lora_targets(projections)
    r = _resolve_rank(model, names, rank, reduction)
    peft = import_peft()
    config = peft.LoraConfig(r=r, lora_alpha=float(r if alpha is None else alpha), lora_dropout=dropout,
                             target_modules=names, bias="none")
    try:
        peft.inject_adapter_in_model(config, model)
    except ValueError as e:
        raise ConfigError(f"LoRA targets {names} not found in {type(model).__name__} ({str(e).splitlines()[0]}); "
                          f"module types found: {module_types(model)}") from e
    if fresh_base:
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in names and isinstance(getattr(module, "base_layer", None), nn.Linear):
                module.base_layer.reset_parameters()
    return r


def lora_param_count(d: int, rank: int, n_layers: int, n_projections: int = 2) -> int:
    """LoRA parameters on square d x d projections: n_layers x n_projections x (d*r + r*d)."""
    return n_layers * n_projections * 2 * d * rank


LORA_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d)  # what fedhet wraps with peft's LoRA by parameter name


@dataclass(frozen=True)
class LoraSplit:
    """After `lora_on_parameters`: the LoRA factors it added and the wrapped modules' frozen original tensors
    (peft's `<module>.base_layer.*`), both in `named_parameters` order."""

    factors: tuple[str, ...]
    frozen: tuple[str, ...]


def lora_on_parameters(model: nn.Module, names: Sequence[str], rank: int, alpha: float | None = None) -> LoraSplit:
    """LoRA of rank `rank` (peft, B = 0 at start: the model's function is unchanged) on every module owning one
    of the parameters `names` (Linear / Conv layers), in place: those modules' original weights and biases are
    frozen; every other parameter stays trainable. AdaptFED's factor-only variant (ours, spec §2.6)."""
    owners = sorted({n.rsplit(".", 1)[0] for n in names})
    modules = dict(model.named_modules())
    unsupported = {o: type(modules[o]).__name__ for o in owners if not isinstance(modules.get(o), LORA_MODULES)}
    if unsupported:
        raise ConfigError(f"LoRA wraps Linear / Conv1d / Conv2d layers; the personalized parameters include "
                          f"{unsupported}: personalize layers of those types (e.g. focal_modulation, "
                          "attention_qkv, mlp) or leave lora_rank unset")
    apply_lora(model, owners, rank=rank, alpha=alpha)
    bases = tuple(f"{o}.base_layer." for o in owners)
    frozen = tuple(n for n, _ in model.named_parameters() if n.startswith(bases))
    for n, p in model.named_parameters():
        p.requires_grad_(not n.startswith(bases))
    factors = tuple(n for n, _ in model.named_parameters() if "lora_" in n)
    return LoraSplit(factors=factors, frozen=frozen)
