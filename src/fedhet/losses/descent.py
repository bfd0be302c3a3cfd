"""One gradient step on a loss, the one place fedhet calls `backward()`: the engine's local loop
(`fedhet.engine.local`) and every training loop outside it (LDM pretraining, FedBiP's concept optimisation, the
VL backbone's pretraining, server-side training, DENSE's generator and distillation, MMD-D's kernel fitting)
take their steps here, so each checks its loss for NaN / inf the same way before it touches the weights.

It lives with the losses (a foundation) so that models and losses may use it as well as the engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from fedhet.errors import TrainingDivergedError


def check_finite(loss: torch.Tensor, where: str, advice: str) -> None:
    """A TrainingDivergedError naming `where` and what to do (`advice`) when the loss is NaN or infinite. A
    one-element loss (the usual) is read once as a float (one sync, as `bool` of a tensor would be; no isfinite /
    all kernels: issue 42's per-step cost); a loss of several elements is checked whole."""
    scalar = loss.numel() == 1
    value = loss.item() if scalar else math.nan
    if math.isfinite(value) if scalar else bool(torch.isfinite(loss).all()):
        return
    shown = value if scalar else f"non-finite in {int((~torch.isfinite(loss)).sum())} of its {loss.numel()} elements"
    raise TrainingDivergedError(f"loss became {shown} in {where}; {advice}")


def descend(optimizer: torch.optim.Optimizer, loss: torch.Tensor, where: str, advice: str, *,
            clip: tuple[Iterable[torch.Tensor], float] | None = None,
            before_step: Callable[[], None] | None = None) -> None:
    """Check `loss` (`check_finite`), zero the gradients, backpropagate, call `before_step` (e.g. a gradient
    edit or a learning-rate change), clip the gradients' norm of `clip`'s parameters to its bound, step."""
    check_finite(loss, where, advice)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if before_step is not None:
        before_step()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(clip[0], clip[1])
    optimizer.step()
