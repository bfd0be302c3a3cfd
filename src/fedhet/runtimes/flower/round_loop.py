"""The Flower ServerApp's round loop: the shared `RoundLoop` with `FlowerClients` as its executor, plus the
stop after a failed round (checkpoint of the last completed round, `stopped.json`) and a progress line per round
("[fedhet] round 3/10  2.4 s  mean test accuracy 0.8120") on stdout, which Flower streams to `flwr run --stream`."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from flwr.serverapp import Grid

from fedhet.atomic import atomic_write_text, strict_json
from fedhet.engine.experiment import Experiment
from fedhet.engine.loop import RoundLoop, RunResult
from fedhet.engine.signals import StopSignals
from fedhet.runtimes.flower.faults import FAULTS_FILE, STOPPED_FILE, RoundFailed
from fedhet.runtimes.flower.server import FlowerClients
from fedhet.runtimes.flower.transport import NodeLink
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)
PROGRESS_PREFIX = "[fedhet] "  # `fedhet flower deploy` echoes the ServerApp's lines that carry it


class FlowerRoundLoop(RoundLoop):
    """The shared RoundLoop with `FlowerClients` as its client executor; faults go to `faults.jsonl`, and a
    round without enough valid replies (RoundLoop rolls back and checkpoints) leaves `stopped.json`."""

    def __init__(self, exp: Experiment, run_dir: Path, grid: Grid, progress: bool = True,
                 timeout: float | None = None, wait_for_nodes: float = 300.0, poll_interval: float = 0.2,
                 stop_event: threading.Event | None = None, partition_query: bool = True,
                 link: NodeLink | None = None) -> None:
        flower = FlowerClients(exp, grid, timeout=timeout, wait_for_nodes=wait_for_nodes, poll_interval=poll_interval,
                               stop_event=stop_event, on_fault=lambda row: self._log_fault(row),
                               partition_query=partition_query, link=link)
        super().__init__(exp, run_dir, flower, progress=False)  # no bar: one line per round (`play_round`)
        self.flower = flower
        self.round_lines = progress and not exp.config.run.quiet
        if self.round_lines:
            print(f"{PROGRESS_PREFIX}{len(flower.link.node_of)} SuperNodes serve the {flower.num_train_clients} "
                  f"clients; {exp.config.method} for {exp.config.rounds} rounds", flush=True)

    def play_round(self, rnd: int, last: int, signals: StopSignals) -> float | None:
        """The shared round, then one line for the log (`flwr run --stream` shows the ServerApp's output)."""
        start = time.perf_counter()
        acc = super().play_round(rnd, last, signals)
        if self.round_lines:
            shown = "not evaluated" if acc is None else f"mean test accuracy {acc:.4f}"
            print(f"{PROGRESS_PREFIX}round {rnd}/{self.cfg.rounds}  {time.perf_counter() - start:.1f} s  {shown}",
                  flush=True)
        return acc

    def _log_fault(self, row: JSONDict) -> None:
        self.dir.path.mkdir(parents=True, exist_ok=True)
        with open(self.dir.path / FAULTS_FILE, "a") as fh:
            fh.write(strict_json(row) + "\n")

    def run(self, stop_after: int | None = None) -> RunResult:
        stopped = self.dir.path / STOPPED_FILE
        try:
            result = super().run(stop_after=stop_after)
        except RoundFailed as err:  # RoundLoop.run has returned to the last completed round and checkpointed it
            message = (f"{err} Stopped; the checkpoint of round {self.round} is {self.dir.latest_checkpoint}. "
                       "Bring the clients back (or lower the minimum) and continue with --resume.")
            atomic_write_text(stopped, strict_json({"round": self.round, "error": message}, indent=2))
            log.error("%s", message)
            raise RoundFailed(message) from None
        stopped.unlink(missing_ok=True)
        if self.round_lines and self.stop_reason is not None:  # privacy.dp.max_epsilon refused the next round
            print(f"{PROGRESS_PREFIX}{self.stop_reason}", flush=True)
        if self.exp.arrangement.novel and result.rounds_completed >= self.cfg.rounds:
            print(f"{PROGRESS_PREFIX}{len(self.exp.arrangement.novel)} clients were held out of training (novel.*); "
                  f"each adapts on its own data with: fedhet adapt {self.dir.path}", flush=True)
        return result
