"""The round loop shared by the runtimes: sample, broadcast, fit, aggregate, evaluate, log, checkpoint (on the one
round driver, engine/driver.py)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from torch.utils.data import ConcatDataset

from fedhet.config import ExperimentConfig
from fedhet.core.contract import ServerState
from fedhet.core.dp import dp_steps
from fedhet.engine.attacks import attack_rows, attack_summary, resolve_attack
from fedhet.engine.checkpoint import load_checkpoint, save_checkpoint
from fedhet.engine.dp_run import open_ledger, refusal
from fedhet.engine.driver import Interrupted as Interrupted  # (re-exported: callers import these from here)
from fedhet.engine.driver import PhaseHook as PhaseHook
from fedhet.engine.driver import RoundDriver
from fedhet.engine.evaluation import evaluate
from fedhet.engine.executor import ClientExecutor, ClientStates
from fedhet.engine.experiment import Experiment
from fedhet.engine.rounds import fit_and_aggregate, sample_round
from fedhet.engine.rundir import TRAIN_TIME, RunDirectory, client_rows, last_avg_test_row, mean_train_time
from fedhet.engine.tracking import Tracker, open_trackers, round_record
from fedhet.errors import ConfigError
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)
ROUNDS_NOTE = (" (schedules that depend on the total number of rounds, e.g. FRAug's lambda_syn and lambda_c, follow "
               "the new total from the next round on, so the result differs from a fresh run of that length)")


@dataclass
class RunResult:
    """Where a run wrote its results, and its final per-client metrics."""

    run_dir: Path
    rounds_completed: int
    final: dict[str, dict[str, float]]
    summary: JSONDict


def run_dir_for(cfg: ExperimentConfig) -> Path:
    """runs/<name>/<dataset>/<label or method>/seed<k>; `name` may hold sub-folders but may not leave out_dir."""
    name = Path(cfg.name)
    if not cfg.name.strip() or name.is_absolute() or ".." in name.parts:
        raise ConfigError(f"name={cfg.name!r} must be a relative folder name inside run.out_dir (no '..', not "
                          "absolute, not empty); to write elsewhere set run.out_dir or pass --run-dir")
    return Path(cfg.run.out_dir) / name / cfg.data.dataset / cfg.variant / f"seed{cfg.seed}"


def evaluated(cfg: ExperimentConfig, rnd: int) -> bool:
    """Whether round `rnd` is evaluated: every eval.every rounds, and the last."""
    return rnd % cfg.eval.every == 0 or rnd == cfg.rounds


def avg_test_accuracy(rows: list[JSONDict]) -> float | None:
    """The average test accuracy of the last round evaluated in `rows` (None: no round was)."""
    row = last_avg_test_row(rows)
    return None if row is None else float(row["accuracy"])


@dataclass(frozen=True)
class Committed:
    """The state at the end of the last completed round: exactly what its checkpoint holds. Client and server
    states are kept by reference; algorithms return new state dicts from `fit` / `aggregate`."""

    round: int
    server: ServerState
    clients: ClientStates
    num_rows: int
    elapsed: float


class RoundLoop(RoundDriver[RunResult]):
    """Drives one experiment over its rounds (engine/driver.py: commit, rollback, signals) with a client
    executor (engine/executor.py: in-process, batched or Flower). A round samples, broadcasts, fits,
    aggregates and evaluates (`play`; phases trained, evaluated), then commits the round counter, the snapshot
    a rollback returns to, the checkpoint and metrics.jsonl (`commit`; phases committed, checkpoint_saved,
    metrics_written)."""

    def __init__(self, exp: Experiment, run_dir: Path, clients: ClientExecutor, progress: bool = True,
                 on_phase: PhaseHook | None = None) -> None:
        self.exp, self.cfg = exp, exp.config
        self.dir = RunDirectory(run_dir)
        super().__init__(f"{self.cfg.variant}/{self.cfg.data.dataset}/s{self.cfg.seed}", self.cfg.rounds,
                         self.dir.latest_checkpoint, progress and not self.cfg.run.quiet, on_phase)
        self.clients = clients
        self.alg = exp.algorithm
        self.server = exp.init_server()
        self.metrics: list[JSONDict] = []
        self.config_changes: list[JSONDict] = []
        self.traffic: dict[str, float] = {}  # the last trained round's, per client (core.messages.traffic)
        self.train_losses: dict[str, float] = {}  # the last trained round's, per client name (`train_loss`)
        self.train_time_s = 0.0  # the last trained round's seconds in fit and aggregate (metrics' train_time_s)
        self.trackers: list[Tracker] = []  # run.loggers (engine/tracking.py), open while `run` runs
        self._committed = self._snapshot()
        self._saved_round = -1  # the round of the checkpoint on disk (-1: none written by or read into this loop)
        self._reopened = False  # a finished run resumed to be extended: summary.json is stale
        self.ledger = open_ledger(exp, clients.num_train_clients)  # privacy.dp's accountant (None: no DP)
        self.stop_reason = refusal(self.ledger, self.server)  # privacy.dp.max_epsilon refuses the next round
        self.attack = resolve_attack(exp)  # attack: its clients, checked before anything trains

    def _snapshot(self) -> Committed:
        return Committed(self.round, self.server, self.clients.get_states(), len(self.metrics), self.elapsed)

    # -------------------------------------------------------------- persistence
    def resume(self, allow_changes: tuple[str, ...] = ()) -> None:
        """Continue from the checkpoint: restore it, rebuild metrics.jsonl from its rows (a kill between the
        checkpoint and the metrics write loses nothing), and re-open a finished run that is being extended."""
        fingerprinted = self.clients.checkpoint_config(self.cfg.to_dict())  # the runtime's version of the config
        payload = load_checkpoint(self.dir.latest_checkpoint, fingerprinted, allow_changes)
        if self.ledger is not None:
            self.ledger.check_resume(dp_steps(payload["server"]))
        self.round, self.server, self.metrics = payload["round"], payload["server"], payload["metrics"]
        self.elapsed, self.config_changes = payload["elapsed"], payload["config_changes"]
        self.traffic = dict(payload.get("traffic", {}))  # checkpoints before it was kept have none
        self.clients.set_states(payload["clients"])
        self._committed, self._saved_round = self._snapshot(), self.round
        self.stop_reason = refusal(self.ledger, self.server)
        self.clients.on_disk()
        self.dir.write_metrics(self.metrics)
        for change in self.config_changes:
            if change["round"] == self.round:
                log.info("resuming after round %d with %s changed: %r -> %r%s", self.round, change["key"],
                         change["old"], change["new"], ROUNDS_NOTE if change["key"] == "rounds" else "")
        # extending a finished run: its summary goes with the first new round's commit (not before: a failure
        # on the way leaves the run as it was)
        self._reopened = self.round < self.cfg.rounds and self.dir.is_finished()
        log.info("resumed %s at round %d", self.dir.path, self.round)

    def checkpoint(self) -> None:
        save_checkpoint(self.dir.latest_checkpoint, config=self.clients.checkpoint_config(self.cfg.to_dict()),
                        round=self.round, server=self.server, clients=self.clients.get_states(), metrics=self.metrics,
                        elapsed=self.elapsed, config_changes=self.config_changes, traffic=self.traffic)
        self._saved_round = self.round
        self.clients.on_disk()
        self._phase("checkpoint_saved", self.round)
        self.dir.write_config(self.cfg.to_dict())  # the config of the run as it stands at its checkpoint
        self.dir.write_metrics(self.metrics)
        self._phase("metrics_written", self.round)

    # -------------------------------------------------------------- one round
    def train_round(self, rnd: int) -> None:
        self.clients.begin_round(rnd)
        sampled = sample_round(self.exp, self.clients.num_train_clients, rnd)
        trained = fit_and_aggregate(self.exp, self.alg, self.server, rnd, sampled, self.clients.fit)
        self.server, self.traffic = trained.server, trained.traffic
        if self.ledger is not None:
            self.metrics.append(self.ledger.row(rnd, dp_steps(self.server)))
        names = self.exp.arrangement.train
        self.train_losses = {names[r.client_id].name: float(loss) for r in trained.replies
                             if isinstance(loss := r.message.scalars.get("train_loss"), (int, float))}

    def evaluate_round(self, rnd: int) -> float | None:
        """Evaluate every training client's deployed model (held-out clients wait for the end); returns the
        average test accuracy. The round's training time (`train_time_s`) goes on its avg test row."""
        info, pool = self.exp.round_info(rnd), self.exp.arrangement.pool(len(self.exp.data.clients))
        messages = {cid: self.alg.broadcast(self.server, info, self.exp.arrangement.state_of[cid]) for cid in pool}
        rows = client_rows(rnd, "test", self.clients.evaluate(rnd, messages, "test"))
        rows = [{**r, TRAIN_TIME: self.train_time_s} if r["client"] == "avg" else r for r in rows]
        rows = attack_rows(self.attack, rows, messages, partial(self.clients.evaluate, rnd))  # ASR, honest accuracy
        if self.cfg.eval.val:
            rows += client_rows(rnd, "val", self.clients.evaluate(rnd, messages, "val"))
        if self.cfg.eval.pooled_test and not self.alg.personalized:
            tests = ConcatDataset([self.exp.data.clients[c].test for c in pool]) if self.exp.arrangement.novel \
                else self.exp.data.pooled_test()
            pooled = evaluate(self.alg.server_model(self.server), tests, self.exp.device)
            rows.append({"round": rnd, "client": "pooled", "split": "pooled", **pooled})
        self.metrics.extend(rows)
        return avg_test_accuracy(rows)

    def play(self, rnd: int) -> float | None:
        """Train, then evaluate round `rnd` when it is due; returns the test accuracy if evaluated."""
        start = time.perf_counter()
        self.train_round(rnd)
        self.train_time_s = time.perf_counter() - start  # fit + aggregate, no evaluation
        self._phase("trained", rnd)
        acc = self.evaluate_round(rnd) if evaluated(self.cfg, rnd) else None
        self._phase("evaluated", rnd)
        return acc

    def commit(self, rnd: int, last: int) -> None:
        """The snapshot a rollback returns to, then the checkpoint (every run.checkpoint_every rounds and at the
        last) or the live metrics."""
        self._committed = self._snapshot()
        self.stop_reason = refusal(self.ledger, self.server)  # before the next round trains
        self._phase("committed", rnd)
        if rnd % self.cfg.run.checkpoint_every == 0 or rnd == last:
            self.checkpoint()
        elif evaluated(self.cfg, rnd):
            self.dir.write_metrics(self.metrics)  # live progress; the checkpoint has the rest
        if self._reopened:
            self.dir.summary_path.unlink(missing_ok=True)
            self._reopened = False

    def after_commit(self, rnd: int, seconds: float) -> None:
        if self.trackers:
            record = round_record(rnd, self.metrics, self.train_losses, seconds, self.traffic)
            for tracker in self.trackers:
                tracker.log_round(record)

    def status(self) -> str | None:
        """The average test accuracy of the last evaluated round (nothing before the first evaluation)."""
        acc = avg_test_accuracy(self.metrics)
        return None if acc is None else f"acc={acc:.3f}"

    # -------------------------------------------------------------- the loop
    def run(self, stop_after: int | None = None) -> RunResult:
        """Play the remaining rounds (up to `stop_after`), then write the summary; trackers follow each round."""
        self.trackers = open_trackers(self.cfg.run.loggers, self.dir.path, self.round, self.cfg.name,
                                      self.cfg.to_dict())
        try:
            return self.drive(stop_after)
        finally:
            for tracker in self.trackers:
                tracker.close()

    def restore(self) -> None:
        """Return to the last completed round (server, client states, metric rows, counter, time) and write its
        checkpoint, unless the one on disk is of that round already (then it, and the config it was written
        with, stay as they are)."""
        committed = self._committed
        self.round, self.server, self.elapsed = committed.round, committed.server, committed.elapsed
        self.clients.set_states(committed.clients)
        del self.metrics[committed.num_rows:]
        if self.round != self._saved_round:
            self.checkpoint()
        else:
            self.dir.write_metrics(self.metrics)

    def finish(self) -> RunResult:
        final_round = max((r["round"] for r in self.metrics), default=0)
        final = {r["client"]: {k: r[k] for k in ("accuracy", "balanced_accuracy", "loss")}
                 for r in self.metrics if r["round"] == final_round and r["split"] in ("test", "pooled")}
        summary = {"name": self.cfg.name, "method": self.cfg.method, "label": self.cfg.variant,
                   "dataset": self.cfg.data.dataset, "seed": self.cfg.seed, "rounds": self.cfg.rounds,
                   "rounds_completed": self.round, "personalized": self.alg.personalized, "final": final,
                   "wall_time_s": self.elapsed, "round_time_s": self.elapsed / max(self.round, 1),
                   "train_time_s": mean_train_time(self.metrics),
                   "device": str(self.exp.device), "config_changes": self.config_changes,
                   **({"traffic_per_client_round": self.traffic} if self.traffic else {}),
                   **(self.server.facts() if isinstance(self.server, ServerState) else {}),
                   **(self.ledger.facts(dp_steps(self.server), self.stop_reason) if self.ledger else {}),
                   **({"attack": attack_summary(self.attack, self.metrics)} if self.attack else {})}
        if self.stop_reason is not None and self._saved_round != self.round:
            self.checkpoint()
        if self.round >= self.cfg.rounds or self.stop_reason is not None:
            self.dir.write_config(self.cfg.to_dict())
            self.dir.write_metrics(self.metrics)  # repairs a metrics.jsonl that lags the final checkpoint
            self.dir.write_summary(summary)
        return RunResult(self.dir.path, self.round, final, summary)
