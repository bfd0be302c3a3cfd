"""Paired cosine-similarity feature penalty (Ditto-MMD baseline "Cos. Sim.", §4; spec ditto_mmd.md §2.5).

The paper's exact form is stripped; this is the spec's suggestion [S]:  mean_b (1 - cos(f_v(x_b), f_w(x_b))),
in [0, 2], zero when the paired features point the same way.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def cosine_similarity_penalty(local: Tensor, reference: Tensor, eps: float = 1e-8) -> Tensor:
    """mean over the batch of 1 - cos(local_b, reference_b); inputs (batch, ...) are flattened to (batch, -1)."""
    if local.shape != reference.shape:
        raise ValueError(f"paired features must have equal shapes, got {tuple(local.shape)}, {tuple(reference.shape)}")
    return (1.0 - F.cosine_similarity(local.flatten(1), reference.flatten(1), dim=1, eps=eps)).mean()
