"""The round loop shared by the runtimes: sample, broadcast, fit, aggregate, evaluate, log, checkpoint."""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from fedhet.config import ExperimentConfig
from fedhet.engine.checkpoint import load_checkpoint, save_checkpoint
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.local import evaluate
from fedhet.engine.rundir import RunDirectory, client_rows
from fedhet.engine.sampling import sample_clients
from fedhet.engine.seeding import seeded
from fedhet.errors import FedhetError, TrainingDivergedError
from fedhet.runtimes.inprocess import InProcessClients

log = logging.getLogger(__name__)


class Interrupted(FedhetError):
    """The run was stopped by Ctrl-C or SIGTERM after a checkpoint was written."""


@dataclass
class RunResult:
    """Where a run wrote its results, and its final per-client metrics."""

    run_dir: Path
    rounds_completed: int
    final: dict[str, dict[str, float]]
    summary: dict[str, Any]


def client_executor(exp: Experiment) -> InProcessClients:
    """The client executor of `run.runtime`: batched (vectorized local training) or in-process (sequential);
    the Flower loop replaces it with its own."""
    if exp.config.run.runtime == "batched":
        from fedhet.runtimes.batched import BatchedClients  # imports torch.func only when asked for

        return BatchedClients(exp)
    return InProcessClients(exp)


def run_dir_for(cfg: ExperimentConfig) -> Path:
    """runs/<name>/<dataset>/<label or method>/seed<k>."""
    return Path(cfg.run.out_dir) / cfg.name / cfg.data.dataset / cfg.variant / f"seed{cfg.seed}"


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so the loop can checkpoint before exiting."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not in the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RoundLoop:
    """Drives one experiment over its rounds with the client executor of `run.runtime`."""

    def __init__(self, exp: Experiment, run_dir: Path, progress: bool = True) -> None:
        self.exp, self.cfg = exp, exp.config
        self.dir = RunDirectory(run_dir)
        self.clients = client_executor(exp)
        self.alg = exp.algorithm
        self.progress = progress and not self.cfg.run.quiet
        with seeded(self.cfg.seed, "server-init"):
            self.server = self.alg.init_server()
        self.round, self.metrics, self.elapsed = 0, [], 0.0

    # -------------------------------------------------------------- persistence
    def resume(self) -> None:
        ckpt = self.dir.latest_checkpoint
        if not ckpt.is_file():
            log.info("no checkpoint in %s; starting from round 1", self.dir.path)
            return
        payload = load_checkpoint(ckpt, self.cfg.to_dict())
        self.round, self.server, self.metrics = payload["round"], payload["server"], payload["metrics"]
        self.elapsed = payload["elapsed"]
        self.clients.set_states(payload["clients"])
        log.info("resumed %s at round %d", self.dir.path, self.round)

    def checkpoint(self) -> None:
        save_checkpoint(self.dir.latest_checkpoint, config=self.cfg.to_dict(), round=self.round,
                        server=self.server, clients=self.clients.get_states(), metrics=self.metrics,
                        elapsed=self.elapsed)
        self.dir.write_metrics(self.metrics)

    # -------------------------------------------------------------- one round
    def train_round(self, rnd: int) -> None:
        n = self.clients.num_train_clients
        sampled = sample_clients(self.cfg.seed, rnd, n, self.cfg.server.fraction_fit,
                                 self.cfg.server.min_fit_clients)
        messages = {cid: self.alg.broadcast(self.server, rnd, cid) for cid in sampled}
        replies = self.clients.fit(rnd, messages)
        with seeded(self.cfg.seed, rnd, "aggregate"):
            self.server = self.alg.aggregate(self.server, replies)

    def evaluate_round(self, rnd: int) -> float:
        """Evaluate every client's deployed model; returns the average test accuracy."""
        n = len(self.exp.data.clients)
        messages = {cid: self.alg.broadcast(self.server, rnd, 0 if self.alg.centralized else cid)
                    for cid in range(n)}
        rows = client_rows(rnd, "test", self.clients.evaluate(rnd, messages, "test"))
        if self.cfg.eval.val:
            rows += client_rows(rnd, "val", self.clients.evaluate(rnd, messages, "val"))
        if self.cfg.eval.pooled_test and not self.alg.personalized:
            pooled = evaluate(self.alg.server_model(self.server), self.exp.data.pooled_test(), self.exp.device)
            rows.append({"round": rnd, "client": "pooled", "split": "pooled", **pooled})
        self.metrics.extend(rows)
        return next(r["accuracy"] for r in rows if r["client"] == "avg" and r["split"] == "test")

    # -------------------------------------------------------------- the loop
    def run(self, stop_after: int | None = None) -> RunResult:
        cfg = self.cfg
        self.dir.write_config(cfg.to_dict())
        last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
        bar = tqdm(total=cfg.rounds, initial=self.round, desc=f"{cfg.method}/{cfg.data.dataset}/s{cfg.seed}",
                   disable=not self.progress, unit="round", dynamic_ncols=True, leave=True)
        acc = math.nan
        committed = (self.server, self.clients.get_states(), len(self.metrics))
        try:
            with _sigterm_as_interrupt():
                while self.round < last:
                    start = time.perf_counter()
                    rnd = self.round + 1
                    committed = (self.server, self.clients.get_states(), len(self.metrics))
                    self.train_round(rnd)
                    evaluated = rnd % cfg.eval.every == 0 or rnd == cfg.rounds
                    if evaluated:
                        acc = self.evaluate_round(rnd)
                    self.elapsed += time.perf_counter() - start
                    self.round = rnd
                    if rnd % cfg.run.checkpoint_every == 0 or rnd == last:
                        self.checkpoint()
                    elif evaluated:
                        self.dir.write_metrics(self.metrics)  # live progress; the checkpoint has the rest
                    bar.update(1)
                    bar.set_postfix(acc=f"{acc:.3f}")
        except KeyboardInterrupt as err:
            bar.close()
            self._rollback(committed)
            self.checkpoint()
            raise Interrupted(f"interrupted after round {self.round}; checkpoint written to "
                              f"{self.dir.latest_checkpoint}. Continue with --resume.") from err
        except TrainingDivergedError:
            bar.close()
            self._rollback(committed)
            self.checkpoint()  # the state after the last completed (finite) round
            log.error("training diverged in round %d; the checkpoint of round %d is in %s",
                      self.round + 1, self.round, self.dir.latest_checkpoint)
            raise
        bar.close()
        return self.finish()

    def _rollback(self, committed: tuple) -> None:
        """Undo a partly done round (server, client states, metric rows), so a checkpoint is consistent."""
        self.server, states, n_rows = committed
        self.clients.set_states(states)
        del self.metrics[n_rows:]

    def finish(self) -> RunResult:
        final_round = max((r["round"] for r in self.metrics), default=0)
        final = {r["client"]: {k: r[k] for k in ("accuracy", "balanced_accuracy", "loss")}
                 for r in self.metrics if r["round"] == final_round and r["split"] in ("test", "pooled")}
        summary = {"name": self.cfg.name, "method": self.cfg.method, "label": self.cfg.variant,
                   "dataset": self.cfg.data.dataset, "seed": self.cfg.seed, "rounds": self.cfg.rounds,
                   "rounds_completed": self.round, "personalized": self.alg.personalized, "final": final,
                   "wall_time_s": self.elapsed,
                   "round_time_s": self.elapsed / max(self.round, 1), "device": str(self.exp.device)}
        if self.round >= self.cfg.rounds:
            self.dir.write_summary(summary)
        return RunResult(self.dir.path, self.round, final, summary)


def run_experiment(cfg: ExperimentConfig, run_dir: str | Path | None = None, resume: bool = False,
                   stop_after: int | None = None, progress: bool = True) -> RunResult:
    """Run (or resume) one experiment in-process and write its run directory."""
    if cfg.run.runtime not in ("inprocess", "batched"):
        raise FedhetError(f"run.runtime={cfg.run.runtime}: start Flower runs with `fedhet flower simulate|deploy`")
    exp = build_experiment(cfg)
    loop = RoundLoop(exp, Path(run_dir) if run_dir else run_dir_for(cfg), progress=progress)
    if resume:
        loop.resume()
    elif loop.dir.latest_checkpoint.is_file():
        raise FedhetError(f"{loop.dir.path} already holds a checkpoint; pass --resume to continue it, "
                          "or choose another run.out_dir / name")
    return loop.run(stop_after=stop_after)
