"""Flower ServerApp / ClientApp for any fedhet algorithm.

`flwr run` loads the module-level `server_app` and `client_app`; they read the experiment from the run
config (fedhet's config as flat dotted keys, see run_config; `run-dir`: where the server writes results, with
`per-run-dir` one folder `run-<Flower run id>` per `flwr run`, see `run_folder`). The simulation binds the same
settings directly with `make_server_app(settings)` / `make_client_app(settings)`. With `node-data`, each node
loads only its own data and the server none (local_data.py). A run the ServerApp refuses or that fails prints
one `[fedhet] ERROR: ...` line to the ServerApp's log (`flwr log RUN_ID`, `flwr run --stream`), then raises, so
Flower marks the run failed (`flwr ls`: status failed, its details the message).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import Context
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from flwr.serverapp import Grid, ServerApp

from fedhet.config import load_config
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.loop import RunResult
from fedhet.engine.rundir import RunDirectory, RunDirError, start_check
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import client, local_data, round_loop
from fedhet.runtimes.flower.records import QUERY_ACTION
from fedhet.runtimes.flower.run_config import RunConfigValue, experiment_run_config, read_run_config
from fedhet.runtimes.flower.transport import NodeLink
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)


@dataclass
class FlowerSettings:
    """What both apps need: the resolved experiment config and, for the server, where to write the run.

    The reply timeout and the minimum share of valid replies are experiment config values
    (`server.reply_timeout`, `server.min_fit_fraction`, `server.min_evaluate_fraction`)."""

    config: JSONDict
    run_dir: str = ""
    wait_for_nodes: float = 300.0  # seconds to wait for all SuperNodes to connect
    partition_query: bool = True  # ask each node its partition-id at start (False: node-id order, no query)
    poll_interval: float = 0.2  # seconds between two pulls for replies (Flower's send_and_receive: 3 s)
    client_state_dir: str = ""  # where clients keep their per-round states ('' = context.state only)
    resume: bool = False  # continue from the run directory's checkpoint
    stop_after: int = 0  # stop (with a checkpoint) after this round; 0 = run all rounds
    node_data: bool = False  # each node loads only its own data (node config data-root), the server none
    per_run_dir: bool = False  # results in run_dir/run-<Flower run id>, one folder per `flwr run` (run_folder)
    resume_from: str = ""  # per_run_dir + resume: the run id to continue ('' = the newest with a checkpoint)
    progress: bool = True  # one line per round on stdout (the ServerApp's log)
    results: list[RunResult] = field(default_factory=list, repr=False)  # filled by the server (same process)
    errors: list[BaseException] = field(default_factory=list, repr=False)  # why the server stopped, if it did
    stop_event: threading.Event = field(default_factory=threading.Event, repr=False)  # set: checkpoint and stop
    finished: threading.Event = field(default_factory=threading.Event, repr=False)  # set when run_server returns

    def to_run_config(self) -> dict[str, RunConfigValue]:
        """As Flower run-config values: the experiment as flat dotted keys (run_config.py) plus the runtime keys."""
        runtime: dict[str, RunConfigValue] = {
            "run-dir": self.run_dir, "wait-for-nodes": self.wait_for_nodes, "poll-interval": self.poll_interval,
            "client-state-dir": self.client_state_dir, "resume": self.resume, "stop-after": self.stop_after,
            "partition-query": self.partition_query, "node-data": self.node_data, "per-run-dir": self.per_run_dir,
            "resume-from": self.resume_from}
        return {**experiment_run_config(self.config), **runtime}

    @classmethod
    def from_run_config(cls, run_config: JSONDict) -> FlowerSettings:
        """The settings of a Flower run config (as `flwr run --run-config` left it); ConfigError naming a bad key."""
        config, runtime = read_run_config(run_config)
        return cls(config=config, run_dir=runtime.get("run-dir", ""),
                   wait_for_nodes=runtime.get("wait-for-nodes", 300.0),
                   poll_interval=runtime.get("poll-interval", 0.2),
                   client_state_dir=runtime.get("client-state-dir", ""),
                   resume=runtime.get("resume", False), stop_after=runtime.get("stop-after", 0),
                   partition_query=runtime.get("partition-query", True),
                   node_data=runtime.get("node-data", False), per_run_dir=runtime.get("per-run-dir", False),
                   resume_from=runtime.get("resume-from", ""))

    def client_setup(self) -> client.ClientSetup:
        return client.ClientSetup(config=self.config, run_dir=self.run_dir, state_dir=self.client_state_dir,
                                  node_data=self.node_data)


def _settings(bound: FlowerSettings | None, context: Context) -> FlowerSettings:
    return bound if bound is not None else FlowerSettings.from_run_config(dict(context.run_config))


def run_folder(settings: FlowerSettings, run_id: int) -> Path:
    """Where this run writes: `run-dir` itself, or with `per-run-dir` the folder `run-<run id>` of this Flower
    run (a second `flwr run` of the same App gets its own); resuming continues `run-<resume-from>`, else the
    newest `run-*` folder holding a checkpoint."""
    if not settings.run_dir:
        raise FedhetError("no run directory given to the Flower ServerApp (run config 'run-dir')")
    base = Path(settings.run_dir)
    if not settings.per_run_dir:
        return base
    if not settings.resume:
        return base / f"run-{run_id}"
    if settings.resume_from:
        return base / f"run-{settings.resume_from.removeprefix('run-')}"
    held = [p for p in base.glob("run-*") if RunDirectory(p).latest_checkpoint.is_file()]
    if not held:
        raise RunDirError(f"resume: no run folder under '{base}' holds a checkpoint; run without resume=true")
    return max(held, key=lambda p: RunDirectory(p).latest_checkpoint.stat().st_mtime)


def _experiment(settings: FlowerSettings, grid: Grid) -> tuple[Experiment, NodeLink | None]:
    """The server's experiment: built from the whole federated data, or (node-data) from the nodes' data
    schemas, with the nodes already mapped (local_data.server_experiment)."""
    cfg = load_config(base=settings.config)
    if not settings.node_data:
        return build_experiment(cfg), None
    link = NodeLink(grid, cfg.server.reply_timeout, settings.poll_interval, settings.stop_event)
    return local_data.server_experiment(cfg, link, settings.wait_for_nodes, settings.partition_query), link


def run_server(grid: Grid, settings: FlowerSettings, run_id: int = 0) -> RunResult:
    """The whole run on the server: the shared RoundLoop with Flower clients; writes the run directory.

    A failure (too few valid replies, Ctrl-C / SIGTERM, ...) is also kept in `settings.errors`."""
    try:
        run_dir = run_folder(settings, run_id)
        with RunDirectory(run_dir).locked():
            start_check(run_dir, settings.resume)
            exp, link = _experiment(settings, grid)
            loop = round_loop.FlowerRoundLoop(exp, run_dir, grid, progress=settings.progress,
                                              wait_for_nodes=settings.wait_for_nodes,
                                              poll_interval=settings.poll_interval, stop_event=settings.stop_event,
                                              partition_query=settings.partition_query, link=link)
            loop.flower.run_folder = run_dir.name if settings.per_run_dir else ""
            if settings.resume:
                loop.resume()
            result = loop.run(stop_after=settings.stop_after or None)
    except BaseException as err:
        settings.errors.append(err)
        raise
    else:
        settings.results.append(result)
        return result
    finally:
        settings.finished.set()


def make_server_app(settings: FlowerSettings | None = None) -> ServerApp:
    """A ServerApp running the experiment in `settings` (None: read it from the run config)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            run_server(grid, _settings(settings, context), context.run_id)
        except FedhetError as err:  # one clear line in the ServerApp's log; Flower marks the run failed
            print(f"{round_loop.PROGRESS_PREFIX}ERROR: run {context.run_id} stopped: {err}", flush=True)
            log.error("run %s stopped: %s", context.run_id, err)
            raise

    return app


def make_client_app(settings: FlowerSettings | None = None, train_mods: Sequence[Mod] = ()) -> ClientApp:
    """A ClientApp answering train / evaluate / query for the client given by the node's partition-id;
    `train_mods`: Flower mods around its training (e.g. `fixedclipping_mod`, docs/flower.md "Differential
    privacy")."""
    app = ClientApp()
    bound = None if settings is None else settings.client_setup()

    def cfg_of(context: Context) -> client.ClientSetup:
        return bound if bound is not None else FlowerSettings.from_run_config(dict(context.run_config)).client_setup()

    @app.train(mods=list(train_mods))
    def train(msg: FlowerMessage, context: Context) -> FlowerMessage:
        return client.handle("train", msg, context, cfg_of(context))

    @app.evaluate()
    def evaluate(msg: FlowerMessage, context: Context) -> FlowerMessage:
        return client.handle("evaluate", msg, context, cfg_of(context))

    @app.query(QUERY_ACTION)
    def query(msg: FlowerMessage, context: Context) -> FlowerMessage:
        return client.handle("query", msg, context, cfg_of(context))

    return app


server_app = make_server_app()
client_app = make_client_app()
