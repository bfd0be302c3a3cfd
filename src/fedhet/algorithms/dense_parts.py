"""DENSE's server-side pieces (the method: `fedhet.algorithms.dense`; Zhang et al., NeurIPS 2022, "DENSE: Data-Free
One-Shot Federated Learning"; official code zj-jayzhang/DENSE, read for the loss terms and defaults).

The DENSE paper itself is not in shared/papers: the terms are named as the official code names them (`oh`, `bn`,
`adv`; the distillation `KLDiv`), not by equation number.

- `Ensemble`: the teacher, the mean of the client models' logits, D(x) = 1/m Σ_k f^k(x) (the official `Ensemble`);
  the client models are ensembled, never averaged.
- `Generator`: DENSE's image generator (z -> Linear -> BN -> 2x (upsample, conv 3x3, BN, LeakyReLU 0.2) -> conv ->
  sigmoid; `ngf` and `nz` set its size), with the official code's re-initialisation (`reset_generator`).
- `BNStatistics`: DeepInversion's BN-statistics term R_BN (official `DeepInversionHook`),
  Σ_l ‖μ_l(x̂) − μ_l‖₂ + ‖σ²_l(x̂) − σ²_l‖₂ over every BatchNorm2d of every client model
  (running statistics vs the batch's).
- `kd_loss` (the distillation KL(D(x̂) ‖ f_S(x̂)) at temperature T, times T²: official `KLDiv`) and
  `adversarial_loss` (the official "decision adversarial" term, −KL(D(x̂) ‖ f_S(x̂)) on the samples where student
  and teacher disagree: the generator seeks them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Ensemble(nn.Module):
    """The mean of the client models' logits."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([m(x) for m in self.members]).mean(dim=0)


class Generator(nn.Module):
    """DENSE's generator at side 4·⌈side/4⌉ (cropped to `side`), `channels` outputs in [0, 1]."""

    def __init__(self, nz: int, ngf: int, side: int, channels: int) -> None:
        super().__init__()
        self.side, self.init = side, math.ceil(side / 4)
        self.fc = nn.Linear(nz, 2 * ngf * self.init ** 2)
        self.blocks = nn.Sequential(
            nn.BatchNorm2d(2 * ngf), nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, 1, 1, bias=False), nn.BatchNorm2d(2 * ngf), nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, 1, 1, bias=False), nn.BatchNorm2d(ngf), nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, channels, 3, 1, 1), nn.Sigmoid())

    def forward(self, z: Tensor) -> Tensor:
        out: Tensor = self.blocks(self.fc(z).view(len(z), -1, self.init, self.init))  # Module calls: untyped
        return out[..., :self.side, :self.side]

    def reset(self, g: torch.Generator) -> None:
        """The official re-initialisation: conv / linear weights N(0, 0.02), biases 0, BN weights N(1, 0.02)."""
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Conv2d)):
                    m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.02)
                    if m.bias is not None:
                        m.bias.zero_()
                elif isinstance(m, nn.BatchNorm2d):
                    m.weight.copy_(1 + torch.randn(m.weight.shape, generator=g) * 0.02)
                    m.bias.zero_()


class BNStatistics:
    """Forward hooks on every BatchNorm2d of `model`: after a forward, `loss()` is R_BN (module doc)."""

    def __init__(self, model: nn.Module) -> None:
        self.terms: list[Tensor] = []
        self.hooks = [m.register_forward_hook(self._hook) for m in model.modules() if isinstance(m, nn.BatchNorm2d)]

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...], _: object) -> None:  # _: the output, unused
        x = inputs[0]
        mean, var = x.mean(dim=(0, 2, 3)), x.transpose(0, 1).flatten(1).var(dim=1, unbiased=False)
        assert isinstance(module, nn.BatchNorm2d) and module.running_mean is not None
        assert module.running_var is not None
        self.terms.append(torch.linalg.vector_norm(module.running_mean - mean)
                          + torch.linalg.vector_norm(module.running_var - var))

    def loss(self) -> Tensor:
        """The sum over the hooked layers of the last forward (then forgotten)."""
        total = torch.stack(self.terms).sum() if self.terms else torch.zeros(())
        self.terms = []
        return total

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def kd_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """KL(softmax(t/T) ‖ softmax(s/T)) · T², mean over the batch: the student matches the teacher."""
    t = temperature
    kl: Tensor = F.kl_div(F.log_softmax(student_logits / t, dim=1), F.softmax(teacher_logits / t, dim=1),
                          reduction="batchmean")
    return kl * t * t


def adversarial_loss(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """−mean_i 1[argmax s_i ≠ argmax t_i] · KL(t_i ‖ s_i) (the official code's masked form)."""
    mask = (student_logits.argmax(dim=1) != teacher_logits.argmax(dim=1)).float()
    kl = F.kl_div(F.log_softmax(student_logits, dim=1), F.softmax(teacher_logits, dim=1), reduction="none").sum(1)
    return -(kl * mask).mean()


def augment(x: Tensor, g: torch.Generator, pad: int = 4) -> Tensor:
    """The official synthesis view, simplified: one random shift (zero padding `pad`, crop) and a random horizontal
    flip per batch (the official code: kornia's per-image RandomCrop(padding 4) + RandomHorizontalFlip)."""
    side_h, side_w = x.shape[-2:]
    dy, dx = (int(v) for v in torch.randint(0, 2 * pad + 1, (2,), generator=g))
    out = F.pad(x, (pad, pad, pad, pad))[..., dy:dy + side_h, dx:dx + side_w]
    return out.flip(-1) if bool(torch.rand((), generator=g) < 0.5) else out
