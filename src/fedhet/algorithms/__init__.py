"""Federated methods, one module each; every module registers its class with `@register`.

`ALGORITHMS` imports every module of this package when a method is first looked up
(fedhet.registry), so a new method is one file with `@register`.
"""

from __future__ import annotations

from fedhet.algorithms.base import Algorithm, ModelAlgorithm
from fedhet.algorithms.registry import ALGORITHMS, register
from fedhet.core.contract import ClientContext, ClientState, ServerState, Work

__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "ClientState", "ModelAlgorithm", "ServerState", "Work",
           "register"]
