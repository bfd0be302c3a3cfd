"""Softmax prediction entropy (FRAug Eq. 6: the RTNet loss contains -L_ent, i.e. it maximises this entropy)."""

from __future__ import annotations

import torch
from torch import Tensor


def softmax_entropy(logits: Tensor, dim: int = -1) -> Tensor:
    """Batch mean of H(softmax(logits)) = -sum_c p_c log p_c, in nats; >= 0, at most log C (uniform logits).

    Sign convention: this is the (positive) entropy; FRAug's L_rt uses `-softmax_entropy(h(u_hat))`.
    Numerically stable (log_softmax); -inf logits contribute 0.
    """
    logp = torch.log_softmax(logits, dim=dim).clamp_min(torch.finfo(logits.dtype).min)
    return -(logp.exp() * logp).sum(dim=dim).mean()
