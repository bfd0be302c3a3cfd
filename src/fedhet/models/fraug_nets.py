"""FRAug's two auxiliary networks (Chen et al., ICCV 2023; dissertation appendix A.3, Tabs. 4-5).

- `Generator` g (shared, averaged by the server): input z (d_z) concatenated with one-hot y (C),
  FC(d_z + C, d_u) BN ReLU | FC(d_u, d_u) BN ReLU  ->  client-agnostic embedding v_hat (d_u).
- `RTNet` m (Representation Transformation Network, local, never communicated):
  FC(d_u, d_z) BN ReLU | FC(d_z, d_u) BN  ->  client-specific residual (d_u). With `num_classes` > 0 its input is
  [v, one-hot(y)] (the official FTNet, HaokunChen245/FRAug networks.py:33-73; the caller adds the residual).

These are plain `nn.Module`s, not `SplitModel`s, so they are not in the model registry; `fedhet.algorithms.fraug`
imports this module directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Generator(nn.Module):
    """Class-conditional 2-layer MLP generator g(z, y) -> v_hat in the feature space (d_u)."""

    def __init__(self, z_dim: int, num_classes: int, feature_dim: int) -> None:
        super().__init__()
        self.z_dim, self.num_classes, self.feature_dim = int(z_dim), int(num_classes), int(feature_dim)
        self.net = nn.Sequential(
            nn.Linear(self.z_dim + self.num_classes, self.feature_dim), nn.BatchNorm1d(self.feature_dim), nn.ReLU(),
            nn.Linear(self.feature_dim, self.feature_dim), nn.BatchNorm1d(self.feature_dim), nn.ReLU(),
        )

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(y.long(), self.num_classes).to(z.dtype)
        out: torch.Tensor = self.net(torch.cat([z, onehot], dim=1))  # nn.Module calls are untyped in torch
        return out


class RTNet(nn.Module):
    """2-layer MLP residual transform m: d_u (+ C) -> d_z -> d_u (no activation after the last BN)."""

    def __init__(self, feature_dim: int, hidden_dim: int, num_classes: int = 0) -> None:
        super().__init__()
        self.feature_dim, self.hidden_dim, self.num_classes = int(feature_dim), int(hidden_dim), int(num_classes)
        self.net = nn.Sequential(
            nn.Linear(self.feature_dim + self.num_classes, self.hidden_dim), nn.BatchNorm1d(self.hidden_dim),
            nn.ReLU(), nn.Linear(self.hidden_dim, self.feature_dim), nn.BatchNorm1d(self.feature_dim),
        )

    def forward(self, v: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """m(v), or m([v, one-hot(y)]) when built with classes."""
        if self.num_classes:
            if y is None:
                raise ValueError("RTNet: built with num_classes needs the labels y")
            v = torch.cat([v, F.one_hot(y.long(), self.num_classes).to(v.dtype)], dim=1)
        out: torch.Tensor = self.net(v)  # nn.Module calls are untyped in torch
        return out
