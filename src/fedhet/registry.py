"""A tiny name -> object registry with nearest-name errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from fedhet.errors import unknown_choice

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects (classes or factories); `get` raises a ConfigError naming the nearest name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:
            raise unknown_choice(self.kind, name, self._items)
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
