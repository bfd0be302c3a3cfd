"""Explicit messages between server and clients: named tensors plus scalars.

A `Message` maps 1:1 onto Flower's records: `arrays` -> ArrayRecord, `scalars` -> MetricRecord/ConfigRecord.
Nothing else crosses the wire, so what an algorithm shares is exactly what it puts here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Scalar = int | float | str | bool


@dataclass
class Message:
    """Named tensors plus scalars sent between server and one client."""

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)

    def num_bytes(self) -> int:
        """Payload size of the arrays (what a real transport would carry)."""
        return sum(t.numel() * t.element_size() for t in self.arrays.values())

    def num_params(self) -> int:
        """How many numbers the arrays hold (the papers' "communicated parameters")."""
        return sum(t.numel() for t in self.arrays.values())


@dataclass
class Reply:
    """A client's answer to a fit request: its message and how many training examples it used."""

    client_id: int
    message: Message
    num_examples: int


def traffic(sent: Sequence[Message], received: Sequence[Message]) -> dict[str, float]:
    """One round's traffic per sampled client (means): parameters and bytes server -> client (`down`) and
    client -> server (`up`)."""
    def mean(values: list[int]) -> float:
        return float(sum(values)) / max(len(values), 1)

    return {"down_params": mean([m.num_params() for m in sent]), "up_params": mean([m.num_params() for m in received]),
            "down_bytes": mean([m.num_bytes() for m in sent]), "up_bytes": mean([m.num_bytes() for m in received])}
