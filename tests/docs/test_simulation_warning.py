"""`fedhet flower simulate` does not print Flower's `run_simulation` deprecation warning twice (flwr logs it through
its own console handler and again through the root handler fedhet's CLI sets): fedhet drops it around its own
call and logs one DEBUG line instead. Flower's real `run_simulation` runs here up to just after its warning."""

from __future__ import annotations

import importlib
import logging

import pytest

pytest.importorskip("flwr")

from fedhet.config import load_config  # noqa: E402
from fedhet.runtimes.flower.simulation import quiet_run_simulation_deprecation, run_flower_simulation  # noqa: E402


class _StopAfterWarning(Exception):
    pass


@pytest.fixture
def flwr_stops_after_its_warning(monkeypatch) -> None:
    """flwr 1.42's run_simulation warns first, then reports telemetry (`event`): stop it there."""
    module = importlib.import_module("flwr.simulation.run_simulation")

    def stop(*args: object, **kwargs: object) -> None:
        raise _StopAfterWarning

    monkeypatch.setattr(module, "event", stop)


def _deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "DEPRECATED FEATURE" in r.getMessage()]


def test_flower_itself_warns_and_fedhet_drops_it(flwr_stops_after_its_warning, caplog) -> None:
    from flwr.simulation import run_simulation

    with caplog.at_level(logging.DEBUG), pytest.raises(_StopAfterWarning):
        run_simulation(None, None, num_supernodes=1)  # type: ignore[arg-type]
    assert len(_deprecations(caplog)) == 1 and "run_simulation" in _deprecations(caplog)[0]  # what is dropped
    caplog.clear()
    with caplog.at_level(logging.DEBUG), quiet_run_simulation_deprecation(), pytest.raises(_StopAfterWarning):
        run_simulation(None, None, num_supernodes=1)  # type: ignore[arg-type]
    assert _deprecations(caplog) == []
    logging.getLogger("flwr").warning("DEPRECATED FEATURE: something else")  # other warnings stay
    assert len(_deprecations(caplog)) == 1


def test_run_flower_simulation_prints_no_deprecation(flwr_stops_after_its_warning, tmp_path, caplog, capfd) -> None:
    cfg = load_config("configs/quickstart.yaml", ["rounds=1"])
    with caplog.at_level(logging.DEBUG), pytest.raises(_StopAfterWarning):
        run_flower_simulation(cfg, tmp_path / "run")
    assert _deprecations(caplog) == [] and "DEPRECATED FEATURE" not in "".join(capfd.readouterr())
    ours = [r for r in caplog.records if r.name == "fedhet.runtimes.flower.simulation"]
    assert len(ours) == 1 and "run_simulation" in ours[0].getMessage() and ours[0].levelno == logging.DEBUG
    assert logging.getLogger("flwr").filters == []  # the filter is gone after the call
