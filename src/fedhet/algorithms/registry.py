"""The method registry: `ALGORITHMS.get(name)` with nearest-name errors."""

from __future__ import annotations

from typing import TypeVar

from fedhet.algorithms.base import AnyAlgorithm
from fedhet.registry import Registry

AlgorithmClass = type[AnyAlgorithm]
ALGORITHMS: Registry[AlgorithmClass] = Registry("method", "fedhet.algorithms")  # its modules register them
T = TypeVar("T", bound=AlgorithmClass)


def register(cls: T) -> T:
    """Class decorator: register an algorithm under its `name`."""
    ALGORITHMS.register(cls.name)(cls)
    return cls
