"""Fixtures shared by the Flower runtime tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def private_flower_home(tmp_path_factory):
    """Flower writes FLWR_HOME (default ~/.flwr: a telemetry id, config.toml); keep the real home untouched.
    Flower test modules use it with `pytestmark = pytest.mark.usefixtures("private_flower_home")`."""
    real = Path.home() / ".flwr"
    before = sorted(real.rglob("*")) if real.exists() else None
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("flwr-home")
        mp.setenv("FLWR_HOME", str(home))
        yield home
    assert (sorted(real.rglob("*")) if real.exists() else None) == before
