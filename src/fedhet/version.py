"""fedhet's version, in one place below every layer: the package exports it, Flower Apps and exports record it."""

__version__ = "0.1.0"
