"""Shared test fixtures: one torch thread; `shared_data` for the real benchmark copies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fedhet_testing import SHARED_DATA, tiny_client, tiny_model  # noqa: F401  (re-exported)

torch.set_num_threads(1)


@pytest.fixture
def shared_data() -> Path:
    """The real benchmark copies (skips the test when they are absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"no shared data at {SHARED_DATA}; set FEDHET_DATA")
    return SHARED_DATA
