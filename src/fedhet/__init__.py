"""fedhet: federated learning under data heterogeneity.

`fedhet.load_exported(folder, client=NAME)` rebuilds a model `fedhet export` wrote (docs/export.md); it is
imported on first use, so `import fedhet` stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedhet.version import __version__

if TYPE_CHECKING:
    from fedhet.launch.exported import load_exported

__all__ = ["__version__", "load_exported"]


def __getattr__(name: str) -> Any:  # Any: whatever lazily re-exported name is asked for
    if name == "load_exported":
        from fedhet.launch.exported import load_exported

        return load_exported
    raise AttributeError(f"module 'fedhet' has no attribute {name!r}")
