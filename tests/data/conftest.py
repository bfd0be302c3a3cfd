"""Shared fixtures for the data-layer tests: one torch thread, the staged data root (or skip)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

try:
    import fedhet  # noqa: F401
except ImportError:  # package not installed: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real data root: $FEDHET_DATA, else /work/shared/data; skips the test when absent."""
    root = Path(os.environ.get("FEDHET_DATA", "/work/shared/data"))
    if not root.is_dir():
        pytest.skip(f"real data root {root} not present (set FEDHET_DATA)")
    return root

