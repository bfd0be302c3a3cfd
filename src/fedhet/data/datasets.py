"""The Dataset type clients hold: indices into in-memory domain tensors plus a per-sample transform."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate


@dataclass(frozen=True)
class Part:
    """Samples `index` of one domain's tensors `x`, `y`."""

    domain: str
    x: torch.Tensor
    y: torch.Tensor
    index: np.ndarray


class IndexedDataset(Dataset[Any]):  # Any: a sample is (transformed x, y); x's type is the modality's
    """Samples from one or more domain tensors by index; returns (transform(x), y) with y an int64 scalar.

    No data is copied: each part references its domain's tensors. `__getitem__` is one index lookup and
    the transform.
    """

    def __init__(self, parts: Sequence[Part], transform: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.parts = [p for p in parts if len(p.index)]
        self.transform = transform
        self._ends = np.cumsum([len(p.index) for p in self.parts]).tolist()
        self._index = [torch.from_numpy(np.asarray(p.index, dtype=np.int64)) for p in self.parts]

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i: int | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(i, list):
            return self.batch(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        k = bisect.bisect_right(self._ends, i)
        j = int(self._index[k][i - (self._ends[k - 1] if k else 0)])
        part = self.parts[k]
        x = part.x[j]
        return (self.transform(x) if self.transform is not None else x), part.y[j]

    @property
    def needs_no_random_numbers(self) -> bool:
        """Whether reading samples leaves every RNG alone: no transform, or an elementwise one (`batchable`)."""
        return self.transform is None or bool(getattr(self.transform, "batchable", False))

    def batch(self, indices: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples `indices` collated: what DataLoader's default collate makes of them one by one, the same values.
        One gather when the data are one part and the transform is elementwise (`batchable`: it is applied to the
        batch) or absent; otherwise sample by sample (a random transform draws in sample order)."""
        if not self.needs_no_random_numbers or len(self.parts) != 1:
            return default_collate([self[int(j)] for j in indices])  # type: ignore[no-any-return]
        index = indices if isinstance(indices, torch.Tensor) else torch.tensor(indices, dtype=torch.int64)
        rows = self._index[0][index]  # torch raises IndexError for an index out of range
        x = self.parts[0].x.index_select(0, rows)  # what x[rows] copies, in half its time on a CPU (issue 42)
        return (self.transform(x) if self.transform is not None else x), self.parts[0].y.index_select(0, rows)

    @property
    def labels(self) -> np.ndarray:
        """All labels in sample order (no transform applied)."""
        if not self.parts:
            return np.zeros(0, np.int64)
        return np.concatenate([p.y[torch.from_numpy(np.asarray(p.index, np.int64))].numpy() for p in self.parts])

    @property
    def domains(self) -> list[str]:
        """The domains this dataset draws from."""
        return list(dict.fromkeys(p.domain for p in self.parts))

    def raw_x(self) -> torch.Tensor:
        """All inputs stacked, untransformed (e.g. to fit a normaliser)."""
        return torch.cat([p.x[torch.from_numpy(np.asarray(p.index, np.int64))] for p in self.parts])

    def with_transform(self, transform: Callable[[torch.Tensor], torch.Tensor] | None) -> IndexedDataset:
        """The same samples with another transform."""
        return IndexedDataset(self.parts, transform)
