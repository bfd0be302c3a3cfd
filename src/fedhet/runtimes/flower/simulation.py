"""Run a fedhet experiment on Flower's simulation engine (one virtual SuperNode per client)."""

from __future__ import annotations

import logging
from pathlib import Path

from fedhet.config import ExperimentConfig
from fedhet.engine.loop import RunResult
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import require_flower

log = logging.getLogger(__name__)


def run_flower_simulation(cfg: ExperimentConfig, run_dir: str | Path, num_cpus: int | None = None,
                          cpus_per_client: float = 1.0, progress: bool = False, verbose: bool = False) -> RunResult:
    """Run `cfg` with Flower's `run_simulation` (Ray backend); results land in `run_dir` as in-process."""
    require_flower()
    from flwr.simulation import run_simulation

    from fedhet.data import build_federated_data
    from fedhet.runtimes.flower.app import FlowerSettings, make_client_app, make_server_app

    config = cfg.to_dict()
    config["run"]["runtime"] = "flower-simulation"
    num_clients = len(build_federated_data(cfg.data, cfg.seed).clients)
    settings = FlowerSettings(config=config, run_dir=str(Path(run_dir).resolve()), progress=progress,
                              wait_for_nodes=60.0)
    backend = {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0}}
    if num_cpus is not None:
        backend["init_args"] = {"num_cpus": num_cpus}
    run_simulation(make_server_app(settings), make_client_app(settings), num_supernodes=num_clients,
                   backend_config=backend, verbose_logging=verbose)  # type: ignore[arg-type]
    if not settings.results:
        raise FedhetError(f"the Flower simulation ended without a result (see the log above); run dir {run_dir}")
    return settings.results[0]
