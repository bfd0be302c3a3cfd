"""All: one model trained centrally on the union of all clients' training data (a privacy-violating oracle).

The runtime gives this method a single pseudo-client holding the pooled training data; each round is one
local training pass on it, and every client is evaluated with that one model on its own test split.
"""

from __future__ import annotations

from fedhet.algorithms.base import Algorithm
from fedhet.algorithms.registry import register


@register
class All(Algorithm):
    """Centralized oracle: FedAvg with one client that holds everyone's data."""

    name = "all"
    centralized = True
