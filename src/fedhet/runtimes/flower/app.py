"""Flower ServerApp / ClientApp for any fedhet algorithm.

`flwr run` loads the module-level `server_app` and `client_app`; they read the experiment from the run
config (`fedhet-config`: the resolved config as JSON, `run-dir`: where the server writes results). The
simulation binds the same settings directly with `make_server_app(settings)` / `make_client_app(settings)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.engine.loop import RunResult
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import client, server


@dataclass
class FlowerSettings:
    """What both apps need: the resolved experiment config and, for the server, where to write the run."""

    config: dict[str, Any]
    run_dir: str = ""
    timeout: float = 3600.0  # seconds to wait for the replies of one round's messages
    wait_for_nodes: float = 300.0  # seconds to wait for all SuperNodes to connect
    progress: bool = False
    results: list[RunResult] = field(default_factory=list, repr=False)  # filled by the server (same process)

    def to_run_config(self) -> dict[str, str | float | bool]:
        """As Flower run config values (flat scalars)."""
        return {"fedhet-config": json.dumps(self.config), "run-dir": self.run_dir, "timeout": self.timeout,
                "wait-for-nodes": self.wait_for_nodes}

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> FlowerSettings:
        if "fedhet-config" not in run_config:
            raise FedhetError("the Flower run config has no 'fedhet-config'; start runs with `fedhet flower deploy` "
                              "or pass --run-config \"fedhet-config='<json>' run-dir='<path>'\"")
        return cls(config=json.loads(str(run_config["fedhet-config"])), run_dir=str(run_config.get("run-dir", "")),
                   timeout=float(run_config.get("timeout", 3600.0)),
                   wait_for_nodes=float(run_config.get("wait-for-nodes", 300.0)))


def _settings(bound: FlowerSettings | None, context: Context) -> FlowerSettings:
    return bound if bound is not None else FlowerSettings.from_run_config(dict(context.run_config))


def run_server(grid: Grid, settings: FlowerSettings) -> RunResult:
    """The whole run on the server: the shared RoundLoop with Flower clients; writes the run directory."""
    cfg = load_config(base=settings.config)
    if not settings.run_dir:
        raise FedhetError("no run directory given to the Flower ServerApp (run config 'run-dir')")
    loop = server.FlowerRoundLoop(build_experiment(cfg), Path(settings.run_dir), grid, progress=settings.progress,
                                  timeout=settings.timeout, wait_for_nodes=settings.wait_for_nodes)
    if loop.dir.latest_checkpoint.is_file():
        raise FedhetError(f"{loop.dir.path} already holds a checkpoint; choose another run directory")
    result = loop.run()
    settings.results.append(result)
    return result


def make_server_app(settings: FlowerSettings | None = None) -> ServerApp:
    """A ServerApp running the experiment in `settings` (None: read it from the run config)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, _settings(settings, context))

    return app


def make_client_app(settings: FlowerSettings | None = None) -> ClientApp:
    """A ClientApp answering train / evaluate / query for the client given by the node's partition-id."""
    app = ClientApp()
    config = None if settings is None else settings.config

    def cfg_of(context: Context) -> dict[str, Any]:
        return config if config is not None else FlowerSettings.from_run_config(dict(context.run_config)).config

    @app.train()
    def train(msg: FlowerMessage, context: Context) -> FlowerMessage:
        return client.handle_train(msg, context, cfg_of(context))

    @app.evaluate()
    def evaluate(msg: FlowerMessage, context: Context) -> FlowerMessage:
        return client.handle_evaluate(msg, context, cfg_of(context))

    @app.query()
    def query(msg: FlowerMessage, context: Context) -> FlowerMessage:
        return client.handle_query(msg, context, cfg_of(context))

    return app


server_app = make_server_app()
client_app = make_client_app()
