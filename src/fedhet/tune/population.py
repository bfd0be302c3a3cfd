"""A tuning population run round by round in this process (spec fedpop.md Alg. 1's loop body; the design in
docs/design_fedpop_runner.md): N_c members share the experiment (data, initial model, method) and differ in
hyperparameters. Each round every live member trains the round's active clients, each with its own local
vector beta^k, scores them by the validation loss of their locally trained models (§2.5) and aggregates with
its server vector alpha. The searches that change vectors between rounds (FedPop-L / -G, SHA) act on the
members through `fedhet.tune.fedpop` and the wrappers.

Randomness: the clients' training, sampling and aggregation use the experiment's streams, so a member with
fixed vectors is the same federation as `fedhet run` of its configuration; the tuner's own draws come from
`numpy_rng(seed, "tune", purpose, round, slot)`, so nothing random needs saving to resume.
"""

from __future__ import annotations

import functools
import statistics
from typing import Any

import numpy as np

from fedhet.core.seeding import numpy_rng
from fedhet.engine.experiment import Experiment
from fedhet.engine.rounds import fit_and_aggregate, sample_round
from fedhet.runtimes.inprocess import InProcessClients
from fedhet.tune.config import TuneConfig
from fedhet.tune.evo import delta_ball
from fedhet.tune.member import Member, MethodCopies
from fedhet.tune.space import HPVector, SearchSpace

CHECK_LOSS = "check_loss"  # the reply scalar fit_client(check=...) adds: the locally trained model's val loss


class Population:
    """The members and the one in-process client runner they take turns on."""

    def __init__(self, exp: Experiment, tune: TuneConfig, space: SearchSpace) -> None:
        self.exp, self.tune, self.space = exp, tune, space
        self.base = exp.algorithm
        self.copies = MethodCopies(exp.config, self.base, space)
        self.runner = InProcessClients(exp)
        self.runner.check_split = "val"
        self.members: list[Member] = []
        self.last_scores: dict[int, list[float]] = {}  # slot -> s_i^k of its active clients, last round

    def rng(self, purpose: str, rnd: int, slot: int = 0) -> np.random.Generator:
        """The tuner's own stream for one decision (re-derived, never saved)."""
        return numpy_rng(self.exp.config.seed, "tune", purpose, rnd, slot)

    def start(self, vectors: list[tuple[HPVector, HPVector]] | None = None) -> None:
        """N_c members from the initial model (Alg. 1: w_i <- w), with (alpha, beta^0) drawn from the search
        space's distributions unless `vectors` gives them."""
        if vectors is None:
            rng = self.rng("init", 0)
            vectors = [(self.space.server.sample(rng), self.space.client.sample(rng))
                       for _ in range(self.tune.num_configs)]
        self.members = [Member(slot=i, alpha=dict(alpha), beta0=dict(beta0), server=self.base.init_server(),
                               clients={}) for i, (alpha, beta0) in enumerate(vectors)]

    def local_vectors(self, member: Member, rnd: int, k: int) -> list[HPVector]:
        """beta^1..beta^K for the round's K active clients: beta^0 itself (`clients: fixed`), or the Delta-ball
        drawn when the member has none (its start, or a FedPop-G replacement; §2.2)."""
        if self.tune.clients == "fixed" or not self.space.client.dims:
            return [dict(member.beta0) for _ in range(k)]
        if len(member.betas) != k:
            member.betas = delta_ball(self.space.client, member.beta0, k, self.rng("ball", rnd, member.slot))
        return member.betas

    def play_round(self, rnd: int) -> None:
        """One communication round of every live member (Alg. 1, lines 'for i in 1..N_c'); the members' scores
        of this round are appended to their histories and kept per client in `last_scores`."""
        sampled = sample_round(self.exp, self.runner.num_train_clients, rnd)
        for member in self.members:
            if not member.alive:
                continue
            betas = self.local_vectors(member, rnd, len(sampled))
            copies = {cid: self.copies.of(member.alpha, beta) for cid, beta in zip(sampled, betas, strict=True)}
            center = self.copies.of(member.alpha, member.beta0)
            self.runner.alg = center
            self.runner.set_states(self.states_of(member))
            trained = fit_and_aggregate(self.exp, center, member.server, rnd, sampled,
                                        functools.partial(self.runner.fit, algorithms=copies))
            member.server = trained.server
            trained_here = set(sampled) | set(member.clients)  # only clients that trained keep a state
            member.clients = {cid: st for cid, st in self.runner.get_states().items() if cid in trained_here}
            scores = [float(r.message.scalars[CHECK_LOSS]) for r in trained.replies]
            self.last_scores[member.slot] = scores
            member.history.append(statistics.fmean(scores))

    def states_of(self, member: Member) -> dict[int, Any]:
        """Every client's state in `member`'s federation (a client that never trained there: a fresh state)."""
        return {cid: member.clients.get(cid) or self.base.init_client(cid)
                for cid in range(self.runner.num_train_clients)}

    def evaluate(self, member: Member, rnd: int, split: str = "test") -> dict[str, dict[str, float]]:
        """The member's deployed models on every client's `split` (its centre beta^0's method deploys)."""
        self.runner.alg = self.copies.of(member.alpha, member.beta0)
        self.runner.set_states(self.states_of(member))
        info = self.exp.round_info(rnd)
        pool = range(len(self.exp.data.clients))
        messages = {cid: self.runner.alg.broadcast(member.server, info, cid) for cid in pool}
        return self.runner.evaluate(rnd, messages, split)
