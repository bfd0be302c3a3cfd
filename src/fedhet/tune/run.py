"""`fedhet tune CONFIG`: population-based hyperparameter tuning of any federated method (FedPop inside RS or SHA,
spec fedpop.md; docs/tune.md), resumable after every round, with results a normal run directory holds:

    runs/<name>/<dataset>/<method>+<wrapper>+<tuner>/seed<k>/
        summary.json, metrics.jsonl, config.yaml   the final configuration's deployed models (fedhet report reads it)
        tune/best_config.yaml                      that configuration as a plain run config (`fedhet run` it)
        tune/members.jsonl                         per round and member: vectors (its clients' beta^k under
                                                   "local"), score, parent, alive
        checkpoints/population.pt                  the population after the last finished round

The members are evaluated at `eval.every` rounds through the current best (lowest-score) live member, so the
learning curve is the tuner's best so far.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from fedhet.atomic import atomic_write_text
from fedhet.config import ExperimentConfig
from fedhet.engine.experiment import build_experiment
from fedhet.engine.loop import Interrupted, run_dir_for
from fedhet.engine.rundir import RunDirectory, RunDirError, check_writable_path, client_rows
from fedhet.engine.signals import StopSignals
from fedhet.errors import FedhetError
from fedhet.tune.apply import apply_vector, check_space, vector_to_dict
from fedhet.tune.checkpoint import FILENAME, SavedPopulation, load_population, save_population
from fedhet.tune.config import TuneConfig, resolve_space, tune_config
from fedhet.tune.fedpop import is_g_round
from fedhet.tune.population import Population, global_search_due, member_scores
from fedhet.tune.wrappers import best_slot, check_rs_budget, sha_rounds, survivors

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """Where the results are, how far the job got, and (when finished) the final configuration's summary."""

    run_dir: Path
    rounds_completed: int
    summary: dict[str, Any]


def tuner_name(tune: TuneConfig) -> str:
    """The tuner part of the run's label: fedpop (L and G), fedpop_l, fedpop_g, fedex, ball (the Delta-ball
    alone) or none (every client trains with beta^0)."""
    if tune.fedpop_l and tune.fedpop_g:
        return "fedpop"
    if tune.fedpop_l or tune.fedpop_g:
        return "fedpop_l" if tune.fedpop_l else "fedpop_g"
    return {"ball": "ball", "fedex": "fedex"}.get(tune.clients, "none")


def run_tuning(cfg: ExperimentConfig, run_dir: str | Path | None = None, *, resume: bool = False,
               overwrite: bool = False, progress: bool = True, stop_after: int | None = None,
               config_dir: Path | None = None) -> TuneResult:
    """Run (or resume) one tuning job in this process (module docstring); everything is checked first."""
    tune = tune_config(cfg)
    if cfg.run.runtime not in ("inprocess", "batched"):
        raise FedhetError(f"fedhet tune runs its members in this process, one after another "
                          f"(run.runtime=inprocess) or as lanes (run.runtime=batched); got {cfg.run.runtime}")
    space = resolve_space(tune, config_dir)
    check_space(space, cfg)
    plan = (sha_rounds(cfg.rounds, tune.eliminations, tune.num_configs, tune.eta, tune.budget)
            if tune.wrapper == "sha" else [])
    check_rs_budget(tune.num_configs if tune.wrapper == "rs" else 0, cfg.rounds, tune.budget)
    if not cfg.label:
        cfg = dataclasses.replace(cfg, label=f"{cfg.variant}+{tune.wrapper}+{tuner_name(tune)}")
    path = Path(run_dir) if run_dir else run_dir_for(cfg)
    check_writable_path(path)
    rundir = RunDirectory(path)
    with rundir.locked():
        _start_check(rundir, resume, overwrite)
        if overwrite:
            rundir.clear()
            shutil.rmtree(path / "tune", ignore_errors=True)
        job = TuningJob(cfg, tune, Population(build_experiment(cfg), tune, space), rundir, plan)
        if resume:
            job.resume()
        else:
            job.population.start()
            rundir.write_config(cfg.to_dict())
        return job.run(progress and not cfg.run.quiet, stop_after)


def _start_check(rundir: RunDirectory, resume: bool, overwrite: bool) -> None:
    checkpoint = rundir.checkpoints / FILENAME
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other: continue the job, or start it again")
    if not resume and not overwrite and (checkpoint.is_file() or rundir.latest_checkpoint.is_file()):
        raise RunDirError(f"'{rundir.path}' already holds a checkpoint: pass --resume to continue the tuning job, "
                          "--overwrite to start it again, or choose another run.out_dir / name")


class TuningJob:
    """The round loop of one tuning job: play, eliminate (SHA), evaluate, commit a checkpoint, report progress."""

    def __init__(self, cfg: ExperimentConfig, tune: TuneConfig, population: Population, rundir: RunDirectory,
                 plan: list[int]) -> None:
        self.cfg, self.tune, self.population, self.dir, self.plan = cfg, tune, population, rundir, plan
        self.round, self.elapsed = 0, 0.0
        self.halted: int | None = None  # the round in which every configuration diverged (halt)
        self.rows: list[dict[str, Any]] = []  # metrics.jsonl: the best member's curve
        self.checkpoint = rundir.checkpoints / FILENAME
        self.members_log = rundir.path / "tune" / "members.jsonl"

    def resume(self) -> None:
        """The population of the last finished round; the member log loses what came after it."""
        saved = load_population(self.checkpoint, self.cfg)
        self.round, self.rows, self.elapsed, self.halted = saved.round, saved.rows, saved.elapsed, saved.halted
        self.population.members, self.population.tried = saved.members, saved.tried
        if self.members_log.is_file():
            kept = [line for line in self.members_log.read_text().splitlines() if _round_of(line) <= self.round]
            atomic_write_text(self.members_log, "".join(line + "\n" for line in kept))

    def run(self, progress: bool, stop_after: int | None) -> TuneResult:
        bar = tqdm(total=self.cfg.rounds, initial=self.round, disable=not progress, unit="round",
                   desc=f"tune {self.cfg.variant}")
        with StopSignals() as signals:
            try:
                for rnd in range(self.round + 1, self.cfg.rounds + 1) if self.halted is None else ():
                    start = time.perf_counter()
                    self.play(rnd)
                    self.elapsed += time.perf_counter() - start
                    with signals.deferred():
                        self.commit(rnd)
                    bar.update(1)
                    bar.set_postfix_str(self.postfix())
                    if self.halted or (stop_after is not None and rnd >= stop_after):
                        break
            except KeyboardInterrupt as err:  # the round in progress is dropped; the last commit stands
                bar.close()
                raise Interrupted(f"interrupted after round {self.round}; the population is saved in "
                                  f"{self.checkpoint}. Continue with --resume.") from err
        bar.close()
        summary = self.finish() if self.round >= self.cfg.rounds or self.halted else {}
        return TuneResult(self.dir.path, self.round, summary)

    def play(self, rnd: int) -> None:
        """One round of every live member, SHA's elimination after it, then FedPop-G among the survivors (so a
        round that is both never ranks a configuration FedPop-G has just re-initialised), and the best member's
        evaluation."""
        pop = self.population
        trained = [m for m in pop.members if m.alive]
        pop.train_round(rnd)
        if not any(m.alive and m.history and math.isfinite(m.history[-1]) for m in pop.members):
            self.halt(rnd, trained)
            return
        if rnd in self.plan:
            live = [m for m in pop.members if m.alive]
            kept = set(survivors([m.slot for m in live], self.scores(live), self.tune.eta))
            for member in live:
                member.alive = member.slot in kept
        if global_search_due(pop, rnd):
            pop.global_search(rnd)
        if rnd % self.cfg.eval.every == 0 or rnd == self.cfg.rounds:
            self.rows += client_rows(rnd, "test", pop.evaluate(self.leader(), rnd, "test"))

    def halt(self, rnd: int, trained: list[Any]) -> None:
        """Every configuration that trained in round `rnd` diverged. With nothing learned (no finite score yet)
        the search space is at fault: an error. Otherwise tuning ends here and the final configuration is chosen
        among them, each in its last finite state (nothing computed is lost; summary.json records `halted`)."""
        if not any(math.isfinite(x) for m in self.population.members for x in m.history):
            raise FedhetError(f"every configuration's training diverged in round {rnd}; narrow the search space "
                              "(e.g. a lower upper bound for train.lr or server.lr) and start again with "
                              "--overwrite")
        log.warning("tune: every configuration's training diverged in round %d; tuning ends here, and the final "
                    "configuration is chosen among them in their last finite state", rnd)
        for member in trained:
            member.alive = True
        self.halted = rnd
        self.rows += client_rows(rnd, "test", self.population.evaluate(self.leader(), rnd, "test"))  # the curve's end

    def scores(self, members: list[Any]) -> list[float]:
        return member_scores(self.tune, self.population.t_g, members)

    def leader(self) -> Any:
        """The live member with the lowest score (ties: the lower slot)."""
        live = [m for m in self.population.members if m.alive and m.history]
        return min(zip(self.scores(live), (m.slot for m in live), live, strict=True))[2]

    def commit(self, rnd: int) -> None:
        """Round `rnd`'s lines of the member log (a history the checkpoint does not hold: written first, so a
        stop before the checkpoint leaves lines that the resume drops and writes again), then the population,
        then metrics.jsonl (rebuilt from the checkpoint's rows)."""
        pop = self.population
        self.members_log.parent.mkdir(exist_ok=True)
        with self.members_log.open("a") as log:
            for m in pop.members:
                local = [vector_to_dict(pop.space.client, b) for b in pop.trained_betas.get(m.slot, [])]
                log.write(json.dumps({"round": rnd, "slot": m.slot, "alive": m.alive, "parent": m.parent,
                                      "born": m.born, "score": m.history[-1] if m.history else None,
                                      **m.values(pop.space), "local": local}) + "\n")
        save_population(self.checkpoint, self.cfg,
                        SavedPopulation(rnd, pop.members, pop.tried, self.rows, self.elapsed, self.halted))
        self.round = rnd
        self.dir.write_metrics(self.rows)

    def postfix(self) -> str:
        """Live configurations, the generation (FedPop-G rounds so far; SHA's stage without FedPop-G) and the
        best-scoring configuration's latest validation loss."""
        live = [m for m in self.population.members if m.alive]
        best = self.leader()
        rounds, t_g = range(1, self.round + 1), self.population.t_g
        generation = (sum(is_g_round(r, t_g, last=self.cfg.rounds) for r in rounds) if self.tune.fedpop_g
                      else sum(r <= self.round for r in self.plan))
        return f"members={len(live)} gen={generation} best={best.history[-1]:.3f} (m{best.slot})"

    def finish(self) -> dict[str, Any]:
        """Choose the final configuration, evaluate its deployed models on test, write the results."""
        pop, cfg = self.population, self.cfg
        live = [m for m in pop.members if m.alive]
        split = "val" if self.tune.select == "val" else "test"
        results = {m.slot: pop.evaluate(m, cfg.rounds, split) for m in live}
        accuracy = [_mean([c["accuracy"] for c in results[m.slot].values()]) for m in live]
        chosen = next(m for m in live if m.slot == best_slot([m.slot for m in live], accuracy))
        test = results[chosen.slot] if split == "test" else pop.evaluate(chosen, cfg.rounds, "test")
        final_rows = client_rows(cfg.rounds, "test", test)
        final = {r["client"]: {k: r[k] for k in ("accuracy", "balanced_accuracy", "loss")} for r in final_rows}
        best_cfg = apply_vector(cfg, pop.space.joint, {**chosen.alpha, **chosen.beta0})
        best_cfg.tune, best_cfg.label = {}, ""
        atomic_write_text(self.dir.path / "tune" / "best_config.yaml",
                          yaml.safe_dump(best_cfg.to_dict(), sort_keys=False))
        tuned = pop.finetuned(chosen, cfg.rounds)
        finetuned = {**tuned, "avg": {"accuracy": _mean([m["accuracy"] for m in tuned.values()])}}
        tried_alpha, tried_beta = pop.tried.counts()
        summary = {"name": cfg.name, "method": cfg.method, "label": cfg.variant, "dataset": cfg.data.dataset,
                   "seed": cfg.seed, "rounds": cfg.rounds, "rounds_completed": self.round, "halted": self.halted,
                   "personalized": pop.base.personalized, "final": final, "wall_time_s": self.elapsed,
                   "round_time_s": self.elapsed / max(self.round, 1), "device": str(pop.exp.device),
                   "tune": {"wrapper": self.tune.wrapper, "tuner": tuner_name(self.tune), "configs": len(pop.members),
                            "selected": chosen.slot, "select": self.tune.select, "values": chosen.values(pop.space),
                            "tried_alpha": tried_alpha, "tried_beta": tried_beta, "finetuned": finetuned}}
        self.dir.write_summary(summary)
        return summary


def _mean(values: list[float]) -> float:
    """The mean over the clients that have a value (NaN: a client without that split), as `client_rows`' avg."""
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")


def _round_of(line: str) -> int:
    """The round of one member-log line (a line cut short by a crash counts as after every round)."""
    try:
        return int(json.loads(line)["round"])
    except (ValueError, KeyError, TypeError):
        return 1 << 30
