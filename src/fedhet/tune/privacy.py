"""privacy.dp in a tuning job (docs/tune.md "Tuning under differential privacy"): every member's rounds are
DP-FedAvg rounds as in a run (engine/rounds.aggregate_round, core/dp.py), each member drawing its noise from its
own streams, and one ledger composes them all, since the members train on the same clients.

A round in which k members train releases k noised aggregates. With `tune.sampling: shared` they are computed on
the same sampled clients: one Poisson sampling (rate q) of k Gaussian mechanisms of multiplier sigma, which is
one sampled Gaussian of multiplier sigma / sqrt(k) (Gaussians compose exactly so). With `per_member` each member
samples its clients apart: k independent sampled Gaussians of multiplier sigma. With q = 1 (local noise, or
every client each round) both are k Gaussians. Only the members that train count: SHA's eliminated members stop
spending, FedPop-G's replacements go on. The ledger's state is the members trained in each round (the
population checkpoint holds it), so a resumed job reports the same epsilon bit for bit.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from fedhet.config import ExperimentConfig
from fedhet.core.dp_accountant import Event, PrivacyLedger, composed_epsilon
from fedhet.core.seeding import derive_seed
from fedhet.engine.dp_run import open_ledger
from fedhet.engine.experiment import Experiment
from fedhet.engine.sampling import sample_size
from fedhet.errors import ConfigError
from fedhet.tune.config import TuneConfig
from fedhet.tune.wrappers import sha_rounds
from fedhet.yaml_input import JSONDict

# what the job's epsilon covers, and what it does not (summary.json says so)
COVERS = ("the noised aggregates of every member-round; not the validation scores the tuner ranks and selects by, "
          "which clients report unnoised")


def member_dp_seed(seed: int, slot: int) -> int:
    """The seed of a member's DP noise streams: its own, so that members' noises are independent (a noise shared
    by two members would cancel in the difference of their aggregates)."""
    return derive_seed(seed, "dp-member", slot)


def planned_members(tune: TuneConfig, rounds: int, eliminations: list[int]) -> list[int]:
    """The members that train in each round when none diverges (at most that many do): the N_c configurations
    every round (FedPop-G's replacements keep the count), SHA's max(1, n // eta) survivors after each of its
    elimination rounds."""
    alive, planned = tune.num_configs, []
    for rnd in range(1, rounds + 1):
        planned.append(alive)
        if rnd in eliminations:
            alive = max(1, alive // tune.eta)
    return planned


def eliminations_of(tune: TuneConfig, rounds: int) -> list[int]:
    """The rounds after which the job's SHA eliminates (none for random search)."""
    return sha_rounds(rounds, tune.eliminations, tune.num_configs, tune.eta, tune.budget) if tune.wrapper == "sha" \
        else []


def check_planned_budget(cfg: ExperimentConfig, tune: TuneConfig, clients: int) -> None:
    """A tuned sweep's check before anything runs: the tuning job's planned spend on `clients` clients (counted
    from the config, tune/budget.train_clients) within privacy.dp.max_epsilon. The job checks again on its data."""
    dp = cfg.privacy.dp
    if dp.active and dp.max_epsilon is not None:
        ledger = PrivacyLedger.for_run(dp, clients, sample_size(clients, cfg.server.fraction_fit,
                                                                cfg.server.min_fit_clients))
        planned = planned_members(tune, cfg.rounds, eliminations_of(tune, cfg.rounds))
        JobPrivacy(ledger, tune.sampling == "shared").check_plan(planned)


@dataclass
class JobPrivacy:
    """A tuning job's privacy ledger: the run's (q, sigma, delta, budget; None without privacy.dp) and the
    members that trained in each DP round so far."""

    ledger: PrivacyLedger | None
    shared: bool  # tune.sampling: shared (the members of a round train the same sampled clients)
    rounds: list[int] = field(default_factory=list)

    @classmethod
    def open(cls, exp: Experiment, tune: TuneConfig, num_train_clients: int, eliminations: list[int]) -> JobPrivacy:
        """The job's ledger, after refusing (before anything trains) a job whose planned spend exceeds
        privacy.dp.max_epsilon."""
        job = cls(open_ledger(exp, num_train_clients), tune.sampling == "shared")
        job.check_plan(planned_members(tune, exp.config.rounds, eliminations))
        return job

    def events(self, rounds: list[int], shared: bool | None = None) -> tuple[Event, ...]:
        """The accountant's events of `rounds` (members trained per round): (q, sigma / sqrt(k), rounds with k
        members) for shared sampling with q < 1, else (q, sigma, member-rounds)."""
        assert self.ledger is not None
        q, sigma = self.ledger.q, self.ledger.cfg.noise_multiplier
        if (self.shared if shared is None else shared) and q < 1:
            return tuple((q, sigma / math.sqrt(k), n) for k, n in sorted(Counter(rounds).items()))
        return ((q, sigma, sum(rounds)),)

    def spent(self, rounds: list[int] | None = None, shared: bool | None = None) -> float:
        """epsilon(delta) of `rounds` (default: the rounds trained so far)."""
        assert self.ledger is not None
        cfg = self.ledger.cfg
        return composed_epsilon(self.events(self.rounds if rounds is None else rounds, shared), cfg.delta,
                                cfg.accountant)

    def check_plan(self, planned: list[int]) -> None:
        """Refuse a job whose planned member-rounds would spend more than max_epsilon, saying what to change."""
        budget = None if self.ledger is None else self.ledger.cfg.max_epsilon
        if self.ledger is None or budget is None:
            return
        cfg, q, epsilon = self.ledger.cfg, self.ledger.q, self.spent(planned)
        if epsilon <= budget:
            return
        apart = (f", or let each member sample its own clients (tune.sampling=per_member: epsilon "
                 f"{self.spent(planned, shared=False):.4g})" if self.shared and q < 1 else "")
        raise ConfigError(f"privacy budget: this tuning job plans {sum(planned)} member-rounds ({planned[0]} "
                          f"configurations, {len(planned)} rounds, q={q:g}, sigma={cfg.noise_multiplier:g}) on the "
                          f"same clients, epsilon {epsilon:.6g} (delta {cfg.delta:g}) > privacy.dp.max_epsilon "
                          f"{budget:g}; nothing was run. Start fewer configurations (tune.configs), raise "
                          f"privacy.dp.noise_multiplier or train fewer rounds{apart}")

    def refusal(self, members: int) -> str | None:
        """Why the next round, in which `members` would train, may not (it would pass max_epsilon), or None."""
        if self.ledger is None or self.ledger.cfg.max_epsilon is None or not members:
            return None
        after = self.spent([*self.rounds, members])
        if after <= self.ledger.cfg.max_epsilon:
            return None
        return (f"privacy budget: round {len(self.rounds) + 1} of {members} members would spend epsilon {after:.6g} "
                f"> privacy.dp.max_epsilon {self.ledger.cfg.max_epsilon:g} (delta {self.ledger.cfg.delta:g}); the "
                f"job stopped after round {len(self.rounds)}")

    def spend(self, rnd: int, members: int) -> list[JSONDict]:
        """Round `rnd`, in which `members` trained, on the ledger; its metrics.jsonl row (none without DP)."""
        if self.ledger is None:
            return []
        self.rounds.append(members)
        return [{"round": rnd, "client": "server", "split": "privacy", "epsilon": self.spent(),
                 "delta": self.ledger.cfg.delta, "dp_rounds": len(self.rounds), "member_rounds": sum(self.rounds)}]

    def facts(self, stopped: str | None) -> JSONDict:
        """summary.json's `privacy` entry (none without DP): the run's, with the job's epsilon and member-rounds."""
        if self.ledger is None:
            return {}
        facts = self.ledger.facts(len(self.rounds), stopped)["privacy"]
        return {"privacy": {**facts, "epsilon": self.spent(), "member_rounds": sum(self.rounds),
                            "members_per_round": list(self.rounds),
                            "sampling": "shared" if self.shared else "per_member", "covers": COVERS}}
