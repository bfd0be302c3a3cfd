"""NaN / inf guards: a loss that diverged stops the run with advice; a server state is checked before commit."""

from __future__ import annotations

import torch

from fedhet.losses.descent import check_finite as check_loss

DIVERGED_ADVICE = (
    "lower train.lr (or server.lr), add train.grad_clip, or check the data for NaNs. The checkpoint of the last "
    "finite round is kept: continue it with `--resume --allow-config-change KEY[,KEY...]` naming every key you "
    "changed (e.g. train.lr), or start again with `--overwrite`.")


def check_finite(loss: torch.Tensor, where: str) -> None:
    """Stop with a clear message when the loss is NaN or infinite (a run's advice: `DIVERGED_ADVICE`)."""
    check_loss(loss, where, DIVERGED_ADVICE)


def first_nonfinite(tree: object, path: str = "") -> str | None:
    """The dotted path of the first floating-point tensor holding NaN / inf in a nested dict / list / dataclass
    of tensors (a server state), or None when all are finite."""
    if isinstance(tree, torch.Tensor):
        return path if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else None
    if hasattr(tree, "__dataclass_fields__"):
        tree = vars(tree)
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, value in items:
        found = first_nonfinite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None
