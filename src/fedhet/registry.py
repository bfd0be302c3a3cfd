"""A tiny name -> object registry with nearest-name errors, which imports its built-in entries when first used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from fedhet.errors import unknown_choice
from fedhet.plugins import import_builtins

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects (classes or factories); `get` raises a ConfigError naming the nearest name.

    `package`: where the built-in entries are registered; its modules are imported (`fedhet.plugins`) before the
    first registration or look-up, so a plug-in that takes a built-in's name fails when it registers."""

    def __init__(self, kind: str, package: str | None = None) -> None:
        self.kind = kind
        self.package = package
        self._items: dict[str, T] = {}
        self._loaded = package is None

    def load(self) -> None:
        """Import the built-in modules, once (a module that registers while they load does not start it again)."""
        if self._loaded or self.package is None:
            return
        self._loaded = True
        try:
            import_builtins(self.package)
        except BaseException:
            self._loaded = False
            raise

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            self.load()
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        self.load()
        if name not in self._items:
            raise unknown_choice(self.kind, name, self._items)
        return self._items[name]

    def names(self) -> list[str]:
        self.load()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        self.load()
        return name in self._items
