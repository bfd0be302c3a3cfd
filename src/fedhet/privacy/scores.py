"""Per-sample membership scores of a classifier: what a threshold attack looks at.

For a sample (x, y) with predicted probabilities p = softmax(f(x)) over C classes (natural logarithms):
- `loss`: the cross-entropy -log p_y (Yeom et al. 2018, the loss-threshold attack; FedBiP Table 4's "Loss");
- `entropy`: the prediction entropy H(p) = -sum_i p_i log p_i, which needs no label (Salem et al. 2018;
  Song & Mittal 2021 §3; FedBiP Table 4's "Entropy");
- `modified_entropy`: Song & Mittal 2021's Mentr(p, y) = -(1 - p_y) log p_y - sum_{i != y} p_i log(1 - p_i),
  which, unlike H, grows when the model is confidently wrong; logarithms of values below 1e-30 are taken at
  1e-30, as in Song & Mittal's code, so a confidently wrong sample scores ~69, not infinity;
- `confidence`: p_y, the probability of the true class (Song & Mittal 2021's confidence attack).

A member (a training sample) is expected to have a lower loss, entropy and modified entropy and a higher
confidence than a non-member: `MEMBER_IS_LOWER` records the direction each attack thresholds in.

The scores are computed in float64 from the logits, restricted like the engine's evaluation to the client's own
classes when it has a client-specific head (`fedhet.core.batches.restrict_logits`: a masked class has p_i = 0),
so the mean `loss` equals the `loss` the run logged on the same split (to float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedhet.core.batches import restrict_logits, to_device
from fedhet.core.protocols import SampleSet
from fedhet.engine.batching import in_order

SCORES = ("loss", "entropy", "modified_entropy", "confidence")
MEMBER_IS_LOWER = {"loss": True, "entropy": True, "modified_entropy": True, "confidence": False}
LOG_FLOOR = 1e-30  # Song & Mittal 2021's floor inside log (their `log_value`)


def scores_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-sample scores (module docstring) of a batch: logits (N, C), integer labels (N,) -> name -> (N,)."""
    log_p = torch.log_softmax(logits.double(), dim=1)
    p = log_p.exp()
    rows = torch.arange(len(labels), device=logits.device)
    log_py, p_y = log_p[rows, labels], p[rows, labels]
    floor = torch.tensor(LOG_FLOOR, dtype=p.dtype, device=p.device)
    log_rest = torch.log(torch.maximum(1.0 - p, floor))  # log(1 - p_i)
    others = (p * log_rest).sum(1) - p_y * log_rest[rows, labels]  # sum over i != y of p_i log(1 - p_i)
    modified = -(1.0 - p_y) * torch.maximum(log_py, floor.log()) - others
    return {"loss": -log_py, "entropy": torch.special.entr(p).sum(1), "modified_entropy": modified,
            "confidence": p_y}


@torch.no_grad()
def sample_scores(model: nn.Module, dataset: SampleSet, device: torch.device, batch_size: int = 256,
                  classes: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Every per-sample score of `model` (put in eval mode) on `dataset`, in the dataset's order, as float64
    arrays; `classes`: the client's own classes (the logits of the others are masked, as in evaluation)."""
    model.eval()
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SCORES}
    for x, y in in_order(dataset, batch_size):
        logits = restrict_logits(model(to_device(x, device)), classes)
        for name, values in scores_from_logits(logits, y.to(logits.device)).items():
            parts[name].append(values.cpu().numpy())
    return {name: np.concatenate(chunks) if chunks else np.zeros(0) for name, chunks in parts.items()}
