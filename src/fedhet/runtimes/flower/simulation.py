"""Run a fedhet experiment on Flower's simulation engine (one virtual SuperNode per client, Ray backend).

Resources: Ray runs `num_cpus / cpus_per_client` ClientApp actors at a time (each builds the experiment once
and then serves any virtual node); the ServerApp runs in a thread of this process. On a 2-core machine,
`num_cpus=2, cpus_per_client=1` gives 2 actors, each training with one torch thread (`run.num_threads=1`).
The clients' per-round states go to `<run_dir>/client_states/`, so `resume=True` continues a stopped run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from fedhet.config import ExperimentConfig
from fedhet.engine.loop import Interrupted, RunResult
from fedhet.engine.rundir import check_writable_path, start_check
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import require_flower
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)


def backend_config(num_cpus: int | None = None, cpus_per_client: float = 1.0) -> JSONDict:
    """Flower's Ray backend config: `cpus_per_client` CPUs reserved per ClientApp actor, `num_cpus` for Ray."""
    backend: JSONDict = {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0}}
    if num_cpus is not None:
        backend["init_args"] = {"num_cpus": num_cpus}
    return backend


class _RunSimulationDeprecation(logging.Filter):
    """Drops flwr's "DEPRECATED FEATURE: The `run_simulation` function is deprecated ..." record. Flower logs it
    through its own console handler and, once a root handler exists (fedhet's CLI sets one), again through that:
    twice, and about a call fedhet makes, which the user cannot change."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("DEPRECATED FEATURE" in text and "`run_simulation`" in text)


@contextlib.contextmanager
def quiet_run_simulation_deprecation() -> Iterator[None]:
    """While inside: no copy of Flower's `run_simulation` deprecation warning; one DEBUG line of fedhet's instead."""
    flwr_logger = logging.getLogger("flwr")
    drop = _RunSimulationDeprecation()
    flwr_logger.addFilter(drop)
    log.debug("starting Flower's simulation engine with flwr.simulation.run_simulation (deprecated in recent flwr in "
              "favour of `flwr run`; fedhet still uses it for `fedhet flower simulate`)")
    try:
        yield
    finally:
        flwr_logger.removeFilter(drop)


def run_flower_simulation(cfg: ExperimentConfig, run_dir: str | Path, num_cpus: int | None = None,
                          cpus_per_client: float = 1.0, progress: bool = False, verbose: bool = False,
                          resume: bool = False, stop_after: int | None = None) -> RunResult:
    """Run `cfg` with Flower's `run_simulation` (Ray backend); results land in `run_dir` as in-process.

    A run stopped by a fault (too few valid replies) or by Ctrl-C leaves the checkpoint of its last completed
    round; `resume=True` continues it (client states from `<run_dir>/client_states/`)."""
    require_flower()
    from flwr.simulation import run_simulation

    from fedhet.data import build_federated_data
    from fedhet.runtimes.flower.app import FlowerSettings, make_client_app, make_server_app

    run_dir = Path(run_dir).resolve()
    check_writable_path(run_dir)
    start_check(run_dir, resume)
    config = cfg.to_dict()
    config["run"]["runtime"] = "flower-simulation"
    num_clients = len(build_federated_data(cfg.data, cfg.seed).clients)
    settings = FlowerSettings(config=config, run_dir=str(run_dir), progress=progress, wait_for_nodes=60.0,
                              client_state_dir=str(run_dir / "client_states"), resume=resume,
                              stop_after=stop_after or 0)
    try:
        with quiet_run_simulation_deprecation():
            run_simulation(make_server_app(settings), make_client_app(settings), num_supernodes=num_clients,
                           backend_config=backend_config(num_cpus, cpus_per_client),
                           verbose_logging=verbose)
    except KeyboardInterrupt:
        settings.stop_event.set()  # the ServerApp thread rolls back, checkpoints and stops
        settings.finished.wait(timeout=60.0)
        raise Interrupted(f"interrupted; the checkpoint of the last completed round is in {run_dir / 'checkpoints'}"
                          ". Continue with --resume.") from None
    except Exception as err:
        if settings.errors and isinstance(settings.errors[0], FedhetError):
            raise settings.errors[0] from None
        if settings.errors:
            raise FedhetError(f"the Flower ServerApp failed: {settings.errors[0]!r}") from err
        raise
    if settings.errors:
        raise settings.errors[0]
    if not settings.results:
        raise FedhetError(f"the Flower simulation ended without a result (see the log above); run dir {run_dir}")
    return settings.results[0]
