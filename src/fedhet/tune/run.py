"""`fedhet tune CONFIG`: population-based hyperparameter tuning of any federated method (FedPop inside RS or SHA,
spec fedpop.md; docs/tune.md), resumable after every round, with results a normal run directory holds:

    runs/<name>/<dataset>/<method>+<wrapper>+<tuner>/seed<k>/
        summary.json, metrics.jsonl, config.yaml   the final configuration's deployed models (fedhet report reads it)
        tune/best_config.yaml                      that configuration as a plain run config (`fedhet run` it)
        tune/members.jsonl                         per round and member: vectors (its clients' beta^k under
                                                   "local"), score, parent, alive, client_rounds (the clients
                                                   trained so far, all members together: the budget spent)
        checkpoints/population.pt                  the population after the last finished round

The members are evaluated at `eval.every` rounds through the current best (lowest-score) live member, so the
learning curve is the tuner's best so far.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedhet.atomic import atomic_write_text
from fedhet.config import ExperimentConfig
from fedhet.engine.driver import PhaseHook, RoundDriver
from fedhet.engine.experiment import build_experiment
from fedhet.engine.loop import evaluated, run_dir_for
from fedhet.engine.rundir import METRIC_KEYS, RunDirectory, claimed, client_rows, nan_mean
from fedhet.engine.signals import StopSignals
from fedhet.errors import FedhetError
from fedhet.tune.apply import apply_vector, check_space, vector_to_dict
from fedhet.tune.checkpoint import FILENAME, SavedPopulation, load_population, save_population
from fedhet.tune.config import TuneConfig, resolve_space, tune_config
from fedhet.tune.fedpop import is_g_round
from fedhet.tune.member import Member
from fedhet.tune.population import Population, member_scores
from fedhet.tune.privacy import JobPrivacy
from fedhet.tune.wrappers import best_slot, check_rs_budget, sha_rounds, survivors
from fedhet.yaml_input import JSONDict

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """Where the results are, how far the job got, and (when finished) the final configuration's summary."""

    run_dir: Path
    rounds_completed: int
    summary: JSONDict


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
               config_dir: Path | None = None, on_phase: PhaseHook | None = None) -> TuneResult:
    """Run (or resume) one tuning job in this process (module docstring) on the engine's round driver (its run
    directory guard, commit and signal handling: engine/driver.py); everything is checked first. `on_phase`:
    as `run_experiment`'s (tests)."""
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
    with claimed(path, resume, overwrite, FILENAME, extra=("tune",)) as rundir:
        job = TuningJob(cfg, tune, Population(build_experiment(cfg), tune, space), rundir, plan,
                        progress and not cfg.run.quiet, on_phase)
        if resume:
            job.resume()
        else:
            job.population.start()
            rundir.write_config(cfg.to_dict())
            job.save()
        return job.drive(stop_after)


class TuningJob(RoundDriver[TuneResult]):
    """One run whose round trains a population (engine/driver.py drives it): play every live member's round,
    eliminate (SHA), evaluate (`play`), then commit the member log, the population checkpoint and the metrics
    (`commit`)."""

    def __init__(self, cfg: ExperimentConfig, tune: TuneConfig, population: Population, rundir: RunDirectory,
                 plan: list[int], progress: bool = False, on_phase: PhaseHook | None = None) -> None:
        super().__init__(f"tune {cfg.variant}", cfg.rounds, rundir.checkpoints / FILENAME, progress, on_phase)
        self.cfg, self.tune, self.population, self.dir, self.plan = cfg, tune, population, rundir, plan
        self.halted: int | None = None  # the round in which every configuration diverged (halt)
        self.rows: list[JSONDict] = []  # metrics.jsonl: the best member's curve
        self.members_log = rundir.path / "tune" / "members.jsonl"
        self.client_rounds = 0  # the clients trained so far, all members together (the budget spent)
        # privacy.dp: every member-round on one ledger; a plan over max_epsilon is refused here (tune/privacy.py)
        self.privacy = JobPrivacy.open(population.exp, tune, population.runner.num_train_clients, plan)
        self.stop_reason = self.privacy.refusal(tune.num_configs)

    def resume(self) -> None:
        """The population of the last finished round; the member log loses what came after it."""
        saved = load_population(self.checkpoint_file, self.cfg)
        self.round, self.rows, self.elapsed, self.halted = saved.round, saved.rows, saved.elapsed, saved.halted
        self.population.members, self.population.tried = saved.members, saved.tried
        self.privacy.rounds = saved.dp_rounds
        self.stop_reason = self.privacy.refusal(sum(m.alive for m in saved.members))
        if self.members_log.is_file():
            kept = [line for line in self.members_log.read_text().splitlines() if _round_of(line) <= self.round]
            atomic_write_text(self.members_log, "".join(line + "\n" for line in kept))
            self.client_rounds = json.loads(kept[-1]).get("client_rounds", 0) if kept else 0

    def stopped(self) -> bool:
        return self.halted is not None or self.stop_reason is not None

    def restore(self) -> None:
        """Nothing to write: the job starts with the population's checkpoint and every round's commit writes it,
        so the one on disk is the last commit's (the interrupted round's changes in memory end with the job)."""

    def conclude(self, signals: StopSignals) -> TuneResult:
        """The final choice and its files when the job has ended (its last round, or a halt); not held back from
        a Ctrl-C, which stops it (it evaluates and finetunes: long), and a resume does it again."""
        ended = self.round >= self.cfg.rounds or self.halted or self.stop_reason
        return self.finish() if ended else TuneResult(self.dir.path, self.round, {})

    def play(self, rnd: int) -> float | None:
        """One round of every live member, SHA's elimination after it, then FedPop-G among the survivors (so a
        round that is both never ranks a configuration FedPop-G has just re-initialised), and the best member's
        evaluation."""
        pop = self.population
        trained = [m for m in pop.members if m.alive]
        pop.train_round(rnd)
        self.rows += self.privacy.spend(rnd, len(trained))  # privacy.dp: epsilon after this round's member-rounds
        if not any(m.alive and m.history and math.isfinite(m.history[-1]) for m in pop.members):
            self.halt(rnd, trained)
            return None
        if rnd in self.plan:
            live = [m for m in pop.members if m.alive]
            kept = set(survivors([m.slot for m in live], member_scores(self.tune, pop.t_g, live), self.tune.eta))
            for member in live:
                member.alive = member.slot in kept
        pop.global_search(rnd)  # if due
        if evaluated(self.cfg, rnd):
            self.rows += client_rows(rnd, "test", pop.evaluate(self.leader(), rnd, "test"))
        return None

    def halt(self, rnd: int, trained: list[Member]) -> None:
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

    def leader(self) -> Member:
        """The live member with the lowest score (ties: the lower slot)."""
        live = [m for m in self.population.members if m.alive and m.history]
        scores = member_scores(self.tune, self.population.t_g, live)
        return min(zip(scores, (m.slot for m in live), live, strict=True))[2]

    def commit(self, rnd: int, last: int) -> None:
        """Round `rnd`'s lines of the member log (a history the checkpoint does not hold: written first, so a
        stop before the checkpoint leaves lines that the resume drops and writes again), then the population,
        then metrics.jsonl (rebuilt from the checkpoint's rows)."""
        pop = self.population
        self._phase("committed", rnd)
        self.members_log.parent.mkdir(exist_ok=True)
        self.client_rounds += sum(len(betas) for betas in pop.trained_betas.values())
        with self.members_log.open("a") as log:
            for m in pop.members:
                local = [vector_to_dict(pop.space.client, b) for b in pop.trained_betas.get(m.slot, [])]
                log.write(json.dumps({"round": rnd, "slot": m.slot, "alive": m.alive, "parent": m.parent,
                                      "born": m.born, "score": m.history[-1] if m.history else None,
                                      **m.values(pop.space), "local": local,
                                      "client_rounds": self.client_rounds}) + "\n")
        self.stop_reason = self.privacy.refusal(sum(m.alive for m in pop.members))  # before the next is sent
        self.save()
        self._phase("checkpoint_saved", rnd)
        self.dir.write_metrics(self.rows)
        self._phase("metrics_written", rnd)

    def save(self) -> None:
        """The population checkpoint of round `round` (round 0: as it starts, so a stop in round 1 resumes)."""
        pop = self.population
        save_population(self.checkpoint_file, self.cfg,
                        SavedPopulation(self.round, pop.members, pop.tried, self.rows, self.elapsed, self.halted,
                                        self.privacy.rounds))

    def status(self) -> str | None:
        """Live configurations, the generation (FedPop-G rounds so far; SHA's stage without FedPop-G) and the
        best-scoring configuration's latest validation loss (nothing before the first round)."""
        if not self.round:
            return None
        live = [m for m in self.population.members if m.alive]
        best = self.leader()
        rounds, t_g = range(1, self.round + 1), self.population.t_g
        generation = (sum(is_g_round(r, t_g, last=self.cfg.rounds) for r in rounds) if self.tune.fedpop_g
                      else sum(r <= self.round for r in self.plan))
        return f"members={len(live)} gen={generation} best={best.history[-1]:.3f} (m{best.slot})"

    def finish(self) -> TuneResult:
        """Choose the final configuration, evaluate its deployed models on test, write the results."""
        pop, cfg = self.population, self.cfg
        split = "val" if self.tune.select == "val" else "test"
        if split == "test":
            log.warning("tune: tune.select=test picks the final configuration by its test accuracy, so its test "
                        "results are not held out; summary.json records selection: test")
        live = [m for m in pop.members if m.alive]
        # a configuration scored +inf since it was (re)initialised is never picked (unless all were: a halt)
        live = [m for m in live if all(math.isfinite(x) for x in m.history)] or live
        results = {m.slot: pop.evaluate(m, cfg.rounds, split) for m in live}
        accuracy = [nan_mean([c["accuracy"] for c in results[m.slot].values()]) for m in live]
        chosen = next(m for m in live if m.slot == best_slot([m.slot for m in live], accuracy))
        test = results[chosen.slot] if split == "test" else pop.evaluate(chosen, cfg.rounds, "test")
        final = {r["client"]: {k: r[k] for k in METRIC_KEYS} for r in client_rows(cfg.rounds, "test", test)}
        best_cfg = apply_vector(cfg, pop.space.joint, {**chosen.alpha, **chosen.beta0})
        best_cfg.tune, best_cfg.label = {}, ""
        atomic_write_text(self.dir.path / "tune" / "best_config.yaml",
                          yaml.safe_dump(best_cfg.to_dict(), sort_keys=False))
        tuned = pop.finetuned(chosen, cfg.rounds)
        finetuned = {**tuned, "avg": {"accuracy": nan_mean([m["accuracy"] for m in tuned.values()])}}
        tried_alpha, tried_beta = pop.tried.counts()
        summary = {"name": cfg.name, "method": cfg.method, "label": cfg.variant, "dataset": cfg.data.dataset,
                   "seed": cfg.seed, "rounds": cfg.rounds, "rounds_completed": self.round, "halted": self.halted,
                   "selection": split, "diverged": _diverged(self.members_log),
                   "personalized": pop.copies.build(chosen.alpha).personalized,  # its own build (EmbNoise: local_bn)
                   "final": final, "wall_time_s": self.elapsed,
                   "round_time_s": self.elapsed / max(self.round, 1), "device": str(pop.exp.device),
                   "tune": {"wrapper": self.tune.wrapper, "tuner": tuner_name(self.tune), "configs": len(pop.members),
                            "selected": chosen.slot, "select": self.tune.select, "values": chosen.values(pop.space),
                            "accuracy": {str(m.slot): a for m, a in zip(live, accuracy, strict=True)},
                            "client_rounds": self.client_rounds,
                            "tried_alpha": tried_alpha, "tried_beta": tried_beta, "finetuned": finetuned},
                   **self.privacy.facts(self.stop_reason)}
        self.dir.write_summary(summary)
        return TuneResult(self.dir.path, self.round, summary)


def _diverged(members_log: Path) -> int:
    """The configurations that scored +inf in some round (their training diverged): distinct (slot, born) pairs
    of the member log, so a slot FedPop-G re-initialised counts once per configuration."""
    lines = members_log.read_text().splitlines() if members_log.is_file() else []
    rows = [json.loads(line) for line in lines]
    return len({(r["slot"], r["born"]) for r in rows if r["score"] is not None and math.isinf(r["score"])})


def _round_of(line: str) -> int:
    """The round of one member-log line (a line cut short by a crash counts as after every round)."""
    try:
        return int(json.loads(line)["round"])
    except (ValueError, KeyError, TypeError):
        return 1 << 30
