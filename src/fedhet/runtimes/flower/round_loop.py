"""The Flower ServerApp's round loop: the shared `RoundLoop` with `FlowerClients` as its executor, plus the
stop after a failed round (checkpoint of the last completed round, `stopped.json`)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid

from fedhet.atomic import atomic_write_text
from fedhet.engine.experiment import Experiment
from fedhet.engine.loop import RoundLoop, RunResult
from fedhet.runtimes.flower.faults import FAULTS_FILE, STOPPED_FILE, RoundFailed
from fedhet.runtimes.flower.server import FlowerClients

log = logging.getLogger(__name__)


class FlowerRoundLoop(RoundLoop):
    """The shared RoundLoop with `FlowerClients` as its client executor; faults go to `faults.jsonl`, and a
    round without enough valid replies (RoundLoop rolls back and checkpoints) leaves `stopped.json`."""

    def __init__(self, exp: Experiment, run_dir: Path, grid: Grid, progress: bool = True,
                 timeout: float | None = None, wait_for_nodes: float = 300.0, poll_interval: float = 0.2,
                 stop_event: threading.Event | None = None) -> None:
        flower = FlowerClients(exp, grid, timeout=timeout, wait_for_nodes=wait_for_nodes, poll_interval=poll_interval,
                               stop_event=stop_event, on_fault=lambda row: self._log_fault(row))
        super().__init__(exp, run_dir, flower, progress=progress)
        self.flower = flower

    def _log_fault(self, row: dict[str, Any]) -> None:
        self.dir.path.mkdir(parents=True, exist_ok=True)
        with open(self.dir.path / FAULTS_FILE, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    def run(self, stop_after: int | None = None) -> RunResult:
        stopped = self.dir.path / STOPPED_FILE
        try:
            result = super().run(stop_after=stop_after)
        except RoundFailed as err:  # RoundLoop.run has returned to the last completed round and checkpointed it
            message = (f"{err} Stopped; the checkpoint of round {self.round} is {self.dir.latest_checkpoint}. "
                       "Bring the clients back (or lower the minimum) and continue with --resume.")
            atomic_write_text(stopped, json.dumps({"round": self.round, "error": message}, indent=2))
            log.error("%s", message)
            raise RoundFailed(message) from None
        stopped.unlink(missing_ok=True)
        return result
