"""The method registry: `ALGORITHMS.get(name)` with nearest-name errors."""

from __future__ import annotations

from fedhet.algorithms.base import Algorithm
from fedhet.registry import Registry

ALGORITHMS: Registry[type[Algorithm]] = Registry("method")


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: register an algorithm under its `name`."""
    return ALGORITHMS.register(cls.name)(cls)
