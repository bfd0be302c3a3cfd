"""Federated methods, one module each; every module registers its class with `@register`.

Importing this package imports every module in it, so a new method is one file with `@register`.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedhet.algorithms.base import Algorithm, ModelAlgorithm
from fedhet.algorithms.registry import ALGORITHMS, register
from fedhet.core.contract import ClientContext, ClientState, ServerState, Work

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "registry"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ALGORITHMS", "Algorithm", "ClientContext", "ClientState", "ModelAlgorithm", "ServerState", "Work",
           "register"]
