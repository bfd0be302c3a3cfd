"""Name -> object registries with nearest-name errors, and how fedhet finds its own entries: a registry names
the package whose modules register its built-ins (`fedhet.data`, `fedhet.models`, `fedhet.algorithms`), and
imports every module of it (not its sub-packages) on the first look-up, so importing a package stays cheap and a
new method, model or dataset is one file with its registration line. A user's plug-ins (a config's `imports`)
are imported by `fedhet.plugins`, which then loads the built-ins of every registry (`load_builtins`), so a
plug-in that takes a built-in's name fails there, naming the plug-in."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from fedhet.errors import unknown_choice

T = TypeVar("T")


_WITH_BUILTINS: list[Registry[Any]] = []  # Any: registries of any item type; every registry with a package of built-ins


class Registry(Generic[T]):
    """Maps names to objects (classes or factories); `get` raises a ConfigError naming the nearest name.
    `package`: where the built-in entries are registered, imported before the first look-up."""

    def __init__(self, kind: str, package: str | None = None) -> None:
        self.kind = kind
        self.package = package
        self._items: dict[str, T] = {}
        self._loaded = package is None
        if package is not None:
            _WITH_BUILTINS.append(self)

    def load(self) -> None:
        """Import the built-in modules, once (a look-up while they load does not start it again)."""
        if self._loaded or self.package is None:
            return
        self._loaded = True
        try:
            folders = importlib.import_module(self.package).__path__
            for module in pkgutil.iter_modules(folders):
                if not module.ispkg:
                    importlib.import_module(f"{self.package}.{module.name}")
        except BaseException:
            self._loaded = False
            raise

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
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


def load_builtins() -> None:
    """The built-ins of every registry made so far (those of a package not yet imported come with it)."""
    for registry in list(_WITH_BUILTINS):
        registry.load()
