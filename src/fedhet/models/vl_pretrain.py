"""Central pretraining of a VL backbone (the stand-in for ViLT's pretrained weights) and its checkpoint file.

FedDAT's premise is a frozen foundation model that has seen other data; with no ViLT weights here, the lead's
pretraining command trains `vl_transformer` (or minilm_vl's new image projection) centrally on a source portion
of the data with `pretrain`, writes it with `save_backbone` and later builds the model with `checkpoint=PATH`.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from tqdm.auto import tqdm

from fedhet.atomic import atomic_path
from fedhet.errors import CheckpointError
from fedhet.losses.descent import descend
from fedhet.models.peft.counting import param_group

Batch = tuple[Sequence[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PretrainResult:
    """Steps taken, wall seconds, mean loss of the last epoch and epochs completed."""

    steps: int
    seconds: float
    loss: float
    epochs: int


def _to(x: torch.Tensor | Sequence[torch.Tensor], device: torch.device) -> torch.Tensor | list[torch.Tensor]:
    """A batch's inputs on `device`: one tensor (images), or a list of them (VQA's [images, questions])."""
    return x.to(device) if isinstance(x, torch.Tensor) else [t.to(device) for t in x]


def _schedule(total: int, warmup: float) -> Callable[[int], float]:
    """Linear warm-up over `warmup` of the steps, then cosine decay to 0."""
    warm = max(1, int(total * warmup))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))

    return factor


def pretrain(model: nn.Module, batches: Iterable[Batch], *, epochs: int = 1, lr: float = 1e-3,
             weight_decay: float = 0.01, warmup: float = 0.05, max_seconds: float | None = None,
             params: Iterable[nn.Parameter] | None = None, log: Callable[[str], None] | None = None,
             progress: bool = False) -> PretrainResult:
    """Cross-entropy training of `params` (default: all) with AdamW and warm-up + cosine decay.

    `batches` yields (x, y) with x = [images, questions] and is iterated once per epoch (a DataLoader);
    training stops early once `max_seconds` have passed. Runs on the model's device. `progress`: a bar over the
    steps, with the epoch and the running loss.
    """
    device = next(model.parameters()).device
    chosen = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    opt = torch.optim.AdamW(chosen, lr=lr, weight_decay=weight_decay)
    total = epochs * len(batches) if isinstance(batches, Sized) else 10**9
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(total, warmup))
    start, steps, done, mean = time.perf_counter(), 0, 0, float("nan")
    bar = tqdm(total=total if total < 10**9 else None, disable=not progress, unit="step", desc="pretrain")
    model.train()
    for epoch in range(epochs):
        losses: list[float] = []
        for x, y in batches:
            loss = F.cross_entropy(model(_to(x, device)), y.to(device))
            descend(opt, loss, f"pretraining, epoch {epoch + 1}", "lower the learning rate (train.lr)")
            sched.step()
            losses.append(float(loss.detach()))
            steps += 1
            bar.update()
            bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.3f}", refresh=False)
            if max_seconds is not None and time.perf_counter() - start > max_seconds:
                break
        mean = sum(losses) / max(1, len(losses))
        done = epoch + 1
        if log is not None:
            log(f"epoch {done}: loss {mean:.4f}, {steps} steps, {time.perf_counter() - start:.1f}s")
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            break
    bar.close()
    return PretrainResult(steps, time.perf_counter() - start, mean, done)


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, batches: Iterable[Batch]) -> float:
    """Top-1 accuracy of `model` over `batches` (eval mode)."""
    device = next(model.parameters()).device
    model.eval()
    right = seen = 0
    for x, y in batches:
        right += int((model(_to(x, device)).argmax(1).cpu() == y).sum())
        seen += len(y)
    return right / max(1, seen)


def backbone_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state without PEFT additions (adapters, LoRA, prompts), on the CPU."""
    named = dict(model.named_parameters())
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
            if k not in named or param_group(k) in ("backbone", "bias", "head")}


def save_backbone(model: nn.Module, path: str | os.PathLike[str],
                  meta: dict[str, Any] | None = None) -> None:  # Any: JSON-like meta, torch-saved
    """Write `backbone_state(model)` and `meta` (e.g. data, seed, accuracy) atomically to `path`."""
    with atomic_path(path) as tmp:
        torch.save({"state": backbone_state(model), "meta": dict(meta or {})}, tmp)


def adapt_input_channels(saved: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """A conv kernel pretrained on C_in channels for a model with another C_in (timm's `adapt_input_conv` rule):
    RGB -> grey sums the colour channels, grey -> RGB repeats the kernel scaled by 1/C; other tensors as saved."""
    if saved.ndim != 4 or own.ndim != 4 or saved.shape[1] == own.shape[1] or \
            saved.shape[0] != own.shape[0] or saved.shape[2:] != own.shape[2:]:
        return saved
    if own.shape[1] == 1:
        return saved.sum(dim=1, keepdim=True)
    if saved.shape[1] == 1:
        return saved.repeat(1, own.shape[1], 1, 1) / own.shape[1]
    return saved


def load_backbone(model: nn.Module, path: str | os.PathLike[str],
                  head: bool = True) -> dict[str, Any]:  # Any: the saved meta
    """Load a `save_backbone` file into `model` (features strictly; the head if `head` and shapes match). A conv
    kernel pretrained on another number of input channels (RGB vs grey) is adapted (`adapt_input_channels`).

    A plain state_dict (name -> tensor, as `torch.save(model.state_dict(), path)` writes it) is read too.
    Returns the file's meta ({} for a plain state_dict); a CheckpointError when it is missing, unreadable, holds
    anything but tensors and plain values (nothing of it is run), or does not fit the model.
    """
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointError(f"no backbone checkpoint at '{path}'; make it first with `fedhet pretrain CONFIG --out "
                              f"{path}` (FedDAT's stand-in backbone: `fedhet pretrain configs/feddat/pretrain.yaml "
                              f"--out {path} --epochs 20`, docs/feddat.md)") from e
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():  # not a crafted pickle: a corrupt or foreign file
            raise CheckpointError(f"cannot read backbone checkpoint '{path}': it is not a file torch.save wrote "
                                  "(corrupt, or another format)") from e
        raise CheckpointError(  # torch's weights-only refusal: never suggest weights_only=False
            f"'{path}' holds objects other than tensors and plain values, so it was not loaded (nothing in it was "
            "run); give a file written by fedhet pretrain or a plain state_dict saved with "
            "torch.save(model.state_dict(), path)") from e
    except Exception as e:
        raise CheckpointError(f"cannot read backbone checkpoint '{path}': {str(e).splitlines()[0]}") from e
    plain = isinstance(blob, dict) and blob and all(isinstance(v, torch.Tensor) for v in blob.values())
    state = blob if plain else blob.get("state") if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise CheckpointError(f"'{path}' is neither a fedhet backbone file nor a state_dict (name -> tensor)")
    own = backbone_state(model)
    state = {k: adapt_input_channels(v, own[k]) if k in own else v for k, v in state.items()}
    body = {k for k in own if not k.startswith("head.")}
    if body != {k for k in state if not k.startswith("head.")}:
        raise CheckpointError(f"backbone checkpoint {path} does not fit this model (different architecture)")
    fits = head and all(k in state and state[k].shape == v.shape for k, v in own.items() if k.startswith("head."))
    keep = {k: v for k, v in state.items() if not k.startswith("head.") or fits}
    try:
        model.load_state_dict(keep, strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"backbone checkpoint {path} does not fit this model: "
                              f"{str(e).splitlines()[-1].strip()}") from e
    return {} if plain else dict(blob.get("meta", {}))
