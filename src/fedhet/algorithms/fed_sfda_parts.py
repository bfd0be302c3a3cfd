"""Fed-SFDA's pieces (AdaptFED Sec. 3.4, spec 2.7): the adaptation losses, the SWA teacher, the server's
source data D_S and its FDA-stylised copy (pre-training on them: `fedhet.algorithms.server_training`). The method
itself: `fedhet.algorithms.fed_sfda`.

- L_PSEUDO (`pseudo_label_loss`): hard pseudo-labels argmax of the teacher, kept where its confidence >=
  threshold; FixMatch's reduction (mean over the whole batch of mask * CE), so a batch with few confident
  samples contributes little instead of a noisy mean over those few.
- L_KD (`kd_loss`): Hinton's KL(p_teacher^T || p_student^T) * T^2 (batch mean), the teacher fixed.
- SWA teacher (`swa_update`): w_g <- (w_g * n + w_c) / (n + 1), n the number of client models already averaged
  (= (t - t_START) / omega when the client fits every round); integer buffers (BatchNorm's step count) are the
  student's, running statistics are averaged like the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.config import DataConfig
from fedhet.core.params import BN_TYPES, StateDict
from fedhet.data import build_federated_data
from fedhet.data.fda import fda_transfer
from fedhet.data.registry import resolve_spec
from fedhet.errors import ConfigError

__all__ = ["SourceData", "keep_batchnorm_statistics", "kd_loss", "load_source", "pseudo_label_loss", "stylise",
           "swa_update"]


def pseudo_label_loss(student: Tensor, teacher: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """(mean over the batch of mask * CE(student, argmax teacher), mask), mask = max softmax(teacher) >= threshold."""
    conf, labels = F.softmax(teacher.detach(), dim=1).max(dim=1)
    mask = conf >= threshold
    per_sample = F.cross_entropy(student, labels, reduction="none")
    return (per_sample * mask).mean(), mask


def kd_loss(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) * T^2, averaged over the batch; no gradient to the teacher."""
    t = F.log_softmax(teacher.detach() / temperature, dim=1)
    s = F.log_softmax(student / temperature, dim=1)
    return F.kl_div(s, t, reduction="batchmean", log_target=True) * temperature ** 2


def keep_batchnorm_statistics(model: nn.Module) -> None:
    """Put `model`'s BatchNorm layers in eval mode: they normalise with, and no longer update, their running
    statistics (their affine weights still train). Fed-SFDA's `bn_stats: source`."""
    for module in model.modules():
        if isinstance(module, BN_TYPES):
            module.eval()


def swa_update(teacher: StateDict, student: StateDict, n: int) -> StateDict:
    """One SWA step, (w_g * n + w_c) / (n + 1) on floating tensors; other tensors are the student's."""
    if n < 0:
        raise ValueError(f"SWA count must be >= 0, got {n}")
    return {k: (teacher[k] * n + v) / (n + 1) if v.is_floating_point() else v.clone() for k, v in student.items()}


@dataclass
class SourceData:
    """The server's labelled source set D_S as model inputs (the source data config's eval transform)."""

    x: Tensor
    y: Tensor
    hflip: bool


def load_source(cfg: DataConfig, seed: int, num_classes: int) -> SourceData:
    """D_S: every training sample of `cfg`'s clients (its domains), loaded through the data registry."""
    data = build_federated_data(cfg, seed)
    if data.num_classes != num_classes or data.modality != "image":
        raise ConfigError(f"method_args.source ({data.dataset}, {data.modality}, {data.num_classes} classes) must be "
                          f"an image dataset with the target's {num_classes} classes; set method_args.source.dataset")
    xs, ys = [], []
    for client in data.clients:
        for x, y in client.train_eval:  # type: ignore[attr-defined]  # the registry's datasets are sized
            xs.append(x)
            ys.append(int(y))
    return SourceData(torch.stack(xs), torch.tensor(ys, dtype=torch.long), resolve_spec(cfg).hflip)


def stylise(x: Tensor, styles: Tensor, band: int, chunk: int = 512) -> Tensor:
    """One FDA-stylised copy of `x`: image i gets the style of a client drawn uniformly (torch's global RNG)."""
    pick = torch.randint(len(styles), (len(x),))
    return torch.cat([fda_transfer(x[i:i + chunk], styles[pick[i:i + chunk]], band)
                      for i in range(0, len(x), chunk)])
