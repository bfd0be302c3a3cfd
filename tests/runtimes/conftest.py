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


@pytest.fixture
def task_identity(monkeypatch):
    """flwr >= 1.2x creates Messages only inside a task (a ServerApp process sets this); emulate one here."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
