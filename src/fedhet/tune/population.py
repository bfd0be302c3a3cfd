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

import copy
import logging
import math
import statistics

import numpy as np

from fedhet.core.contract import ClientState
from fedhet.core.messages import Reply
from fedhet.core.protocols import num_samples
from fedhet.core.seeding import FINETUNE, numpy_rng, seeded
from fedhet.engine.experiment import Experiment
from fedhet.engine.local import evaluate_client
from fedhet.engine.rounds import aggregate_round, broadcast_round, sample_round
from fedhet.errors import TrainingDivergedError
from fedhet.launch.run import make_executor
from fedhet.runtimes.inprocess import FitJob
from fedhet.tune.config import TuneConfig
from fedhet.tune.evo import anneal, delta_ball
from fedhet.tune.fedex import fedex_draw, fedex_start, fedex_step
from fedhet.tune.fedpop import L_GAMMA, Tried, fedpop_g, fedpop_l, is_g_round, l_window_open, member_score
from fedhet.tune.fitting import CHECK_LOSS, MemberRound, fit_members
from fedhet.tune.member import Member, MethodCopies
from fedhet.tune.privacy import member_dp_seed
from fedhet.tune.space import HPVector, SearchSpace

log = logging.getLogger(__name__)


class Population:
    """The members and the one in-process client runner they take turns on."""

    def __init__(self, exp: Experiment, tune: TuneConfig, space: SearchSpace) -> None:
        self.exp, self.tune, self.space = exp, tune, space
        self.copies = MethodCopies(exp, space)
        self.copies.check_builds()
        self.runner = make_executor(exp)  # the one factory `fedhet run` uses (run.runtime)
        self.runner.check_split = "val"
        self.members: list[Member] = []
        self.last_scores: dict[int, list[float]] = {}  # slot -> s_i^k of its active clients, last round
        self.trained_betas: dict[int, list[HPVector]] = {}  # slot -> the beta^k its clients trained with, last round
        self.tried = Tried()  # the distinct alpha / beta that trained, diverged or not (Table 1)
        self.t_g = tune.g_rounds(exp.config.rounds)

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
        self.members = [Member(slot=i, alpha=dict(alpha), beta0=dict(beta0),
                               server=self.exp.init_server(self.copies.of(alpha, beta0)))
                        for i, (alpha, beta0) in enumerate(vectors)]

    def local_vectors(self, member: Member, rnd: int, k: int) -> list[HPVector]:
        """beta^1..beta^K for the round's K active clients: beta^0 itself (`clients: fixed`), FedEx's draws from
        its candidates, or the Delta-ball drawn when the member has none (its start, or a FedPop-G
        replacement; §2.2)."""
        t = self.tune
        if t.clients == "fedex" and self.space.client.dims:
            if member.fedex is None:
                member.fedex = fedex_start(self.space.client, self.rng("fedex-start", 0, member.slot),
                                           beta0=member.beta0, eps=t.eps0, mode=t.fedex_candidates,
                                           discount=t.fedex_baseline, sched=t.fedex_sched)
                member.beta0 = member.fedex.mle()
            # the candidate each active client trains with, drawn from theta on the round's own stream
            drawn = fedex_draw(member.fedex, k, self.rng("fedex", rnd, member.slot))
            member.betas = [dict(member.fedex.candidates[j]) for j in drawn]
            return member.betas
        if t.clients == "fixed" or not self.space.client.dims:
            return [dict(member.beta0) for _ in range(k)]
        if len(member.betas) != k:
            member.betas = delta_ball(self.space.client, member.beta0, k, self.rng("ball", rnd, member.slot))
            member.beta_history = [[] for _ in member.betas]
        if t.fedpop_l and t.l_after == "best" and member.best_local is not None and not l_window_open(
                rnd - member.born - 1, self.t_g, t.l_window):  # the official code's switch to the best
            return [dict(member.betas[member.best_local]) for _ in range(k)]
        return member.betas

    def play_round(self, rnd: int) -> None:
        """`train_round`, then FedPop-G if this is one of its rounds."""
        self.train_round(rnd)
        self.global_search(rnd)

    def train_round(self, rnd: int) -> None:
        """One communication round of every live member (Alg. 1, lines 'for i in 1..N_c'): broadcasts, the
        clients' training (fitting.fit_members: one after another in-process, all members' clients at once as
        lanes with `run.runtime: batched`), then each member's aggregation and FedPop-L / FedEx. The members'
        scores of this round are appended to their histories and kept per client in `last_scores`."""
        sampled = sample_round(self.exp, self.runner.num_train_clients, rnd)
        plans = [plan_round(self, member, rnd, sampled) for member in self.members if member.alive]
        self.trained_betas = {plan.member.slot: [dict(b) for b in plan.betas] for plan in plans}  # the HP log's
        for plan in plans:  # Table 1 counts every vector that trains, whether or not its training diverges
            self.tried.note(plan.member.alpha, plan.betas)
        fitted = fit_members(self.runner, rnd, plans, self.states_of)
        for plan in plans:
            member, result = plan.member, fitted[plan.member.slot]
            try:
                if isinstance(result, str):
                    raise TrainingDivergedError(result)
                trained = aggregate_round(self.exp, plan.center, member.server, rnd, plan.messages, result[0],
                                          dp_seed=member_dp_seed(self.exp.config.seed, member.slot))
            except TrainingDivergedError as err:  # bad hyperparameters: the worst score, not the job's end
                self.diverged(member, rnd, str(err))
                continue
            member.server = trained.server
            member.clients = {**member.clients, **result[1]}  # only clients that trained keep a state
            self.after_training(member, rnd, trained.replies)

    def after_training(self, member: Member, rnd: int, replies: list[Reply]) -> None:
        """The member's score of this round and its searches: FedPop-L, or FedEx's exponentiated-gradient step
        on the validation errors of this round's draws (beta^0 is its most likely candidate afterwards)."""
        scores = [float(r.message.scalars[CHECK_LOSS]) for r in replies]
        self.last_scores[member.slot] = scores
        finite = [x for x in scores if math.isfinite(x)]  # a client with no validation data has none
        member.history.append(statistics.fmean(finite) if finite else math.inf)
        sizes = [num_samples(self.exp.data.clients[r.client_id].val) for r in replies]
        weighted = [(x, n) for x, n in zip(scores, sizes, strict=True) if math.isfinite(x) and n]
        member.weighted_last = (sum(x * n for x, n in weighted) / sum(n for _, n in weighted) if weighted
                                else math.inf)
        if self.tune.fedpop_l and self.tune.clients == "ball" and self.space.client.dims:
            self.local_search(member, rnd, scores)  # (a space without client values has no local search)
        if member.fedex is not None:  # the draw `local_vectors` made: the round's stream, theta has not moved since
            chosen = fedex_draw(member.fedex, len(replies), self.rng("fedex", rnd, member.slot))
            errors = [1.0 - float(r.message.scalars["check_accuracy"]) for r in replies]
            member.fedex = fedex_step(member.fedex, chosen, errors, sizes)
            member.beta0 = member.fedex.mle()

    def diverged(self, member: Member, rnd: int, why: str) -> None:
        """A member whose training diverged keeps its last finite state and scores +inf this round, so FedPop-G
        replaces it or SHA drops it; without FedPop-G it stops training (random search cannot revive it)."""
        log.info("tune: configuration %d diverged in round %d (%s)", member.slot, rnd, why)
        member.history.append(math.inf)
        self.last_scores[member.slot] = []
        member.weighted_last = math.inf
        member.alive = member.alive and self.tune.fedpop_g

    def local_search(self, member: Member, rnd: int, scores: list[float]) -> None:
        """FedPop-L (Alg. 1): the member's worst local vectors become Evo-perturbed copies of its best, for the
        first l_window * T_g rounds after its (re)initialisation (eps annealed over that window, p_re over R_c).
        Each local vector is ranked by the 0.9-discounted mean of the losses it scored since it was set (the
        official code's; `tune.l_score: round`: this round's loss alone); a replaced one starts a new list."""
        since = rnd - member.born - 1
        t = self.tune
        history = member.beta_history if len(member.beta_history) == len(scores) else [[] for _ in scores]
        for losses, x in zip(history, scores, strict=True):
            losses.append(x)
        ranked = scores if t.l_score == "round" else [member_score(h, "powerlaw", L_GAMMA) for h in history]
        if l_window_open(since, self.t_g, t.l_window):  # the official code's idx_selected: the best, ties the first
            member.best_local = int(np.argmin(np.where(np.isnan(ranked), np.inf, ranked)))
        betas = fedpop_l(member.betas, ranked, member.beta0, anneal(t.eps0, since, t.l_window * self.t_g),
                         anneal(t.p_re0, rnd, self.exp.config.rounds), self.rng("L", rnd, member.slot),
                         self.space.client, rounds_since_init=since, t_g=self.t_g, share=t.l_window,
                         rho=t.rho, rule=t.split)
        member.beta_history = [h if new == old else [] for h, new, old in zip(history, betas, member.betas,
                                                                             strict=True)]
        member.betas = betas

    def global_search(self, rnd: int) -> None:
        """FedPop-G (Alg. 1) if `tune.fedpop_g` and `rnd` is one of its rounds (every T_g rounds and the last,
        fedpop.is_g_round): the bottom group of the live members by their score (`tune.split`) take a top member's
        weights, server state (its optimizer's too) and client states, and Evo of its (alpha, beta^0) except its
        build-time values (tune/keys.py), which come with the weights; their local vectors are resampled next
        round and their score history restarts."""
        if not (self.tune.fedpop_g and is_g_round(rnd, self.t_g, last=self.exp.config.rounds)):
            return
        live = [m for m in self.members if m.alive]
        t, rounds = self.tune, self.exp.config.rounds
        scores = member_scores(t, self.t_g, live)
        eps = anneal(t.eps0, rnd, rounds)
        chosen = fedpop_g([m.alpha for m in live], [m.beta0 for m in live], scores, eps, anneal(t.p_re0, rnd, rounds),
                          self.rng("G", rnd), self.space.server, self.space.client, rho=t.rho, rule=t.split,
                          beta_eps=2 * t.eps0 if t.g_beta_eps == "double" else eps)
        parents = {r.top: copy.deepcopy((live[r.top].server, live[r.top].clients)) for r in chosen}
        for r in chosen:
            child, built = live[r.bottom], {k: live[r.top].alpha[k] for k in self.copies.build_keys}
            child.server, child.clients = copy.deepcopy(parents[r.top])  # with its weights, its build-time values:
            child.alpha, child.beta0, child.betas, child.history = {**r.alpha, **built}, dict(r.beta0), [], []
            child.weighted_last = math.inf  # (its beta_history restarts with the Delta-ball, `local_vectors`)
            child.born, child.parent, child.best_local = rnd, live[r.top].slot, None

    def states_of(self, member: Member) -> dict[int, ClientState]:
        """Every client's state in `member`'s federation (a client that never trained there: a fresh state)."""
        center = self.copies.of(member.alpha, member.beta0)
        return {cid: member.clients.get(cid) or center.init_client(cid) for cid in range(self.runner.num_train_clients)}

    def evaluate(self, member: Member, rnd: int, split: str = "test") -> dict[str, dict[str, float]]:
        """The member's deployed models on every client's `split` (its centre beta^0's method deploys)."""
        self.runner.alg = self.copies.of(member.alpha, member.beta0)
        self.runner.set_states(self.states_of(member))
        pool = list(range(len(self.exp.data.clients)))
        return self.runner.evaluate(rnd, broadcast_round(self.exp, self.runner.alg, member.server, rnd, pool), split)

    def finetuned(self, member: Member, rnd: int) -> dict[str, dict[str, float]]:
        """The paper's "finetuned" accuracy (§2.11): every client trains the member's global model once with
        the member's beta^0 (Loc(beta^0)) and is scored on its own test split; nothing is kept. The clients train
        as lanes on the batched runtime, each on its own (seed, round, client, "finetune") stream. A client whose
        finetuning diverges keeps the global model (what a user would deploy), marked `diverged: 1.0`."""
        center, states = self.copies.of(member.alpha, member.beta0), self.states_of(member)
        clients = self.exp.data.clients
        tested = [cid for cid, client in enumerate(clients) if client.test is not None and cid in states]
        messages = broadcast_round(self.exp, center, member.server, rnd, tested)
        jobs = [FitJob(center, cid, msg, states[cid], FINETUNE, clients[cid], "test") for cid, msg in messages.items()]
        results = {}
        for job, reply in zip(jobs, [out.reply for out in self.runner.fit_jobs(rnd, jobs)], strict=True):
            assert job.data is not None and job.data.test is not None  # the jobs' own
            if reply is not None:
                results[job.data.name] = {"accuracy": float(reply.scalars["check_accuracy"]),
                                          "loss": float(reply.scalars[CHECK_LOSS])}
                continue
            with seeded(self.exp.config.seed, rnd, job.cid, FINETUNE):
                metrics = evaluate_client(center, job.msg, job.state, self.exp.context(job.cid, rnd), job.data.test)
            results[job.data.name] = {"accuracy": metrics["accuracy"], "loss": metrics["loss"], "diverged": 1.0}
        return results


def member_scores(tune: TuneConfig, t_g: int, members: list[Member]) -> list[float]:
    """FedPop-G's and SHA's score of each member (lower is better): `tune.score` over its history since its
    (re)initialisation, the last T_g rounds (Eq. 5); `last_weighted`: its last round's validation-size-weighted
    mean loss (the official code's)."""
    if tune.score == "last_weighted":
        return [m.weighted_last for m in members]
    return [member_score(m.history, tune.score, tune.gamma_g, window=t_g) for m in members]


def plan_round(pop: Population, member: Member, rnd: int, shared: list[int]) -> MemberRound:
    """The member's round `rnd`: its active clients (the round's `shared` sample, or with `tune.sampling:
    per_member`, the official code's, as many drawn for it alone, without replacement, from its own stream),
    their local vectors and method copies, and its messages."""
    sampled = shared
    if pop.tune.sampling != "shared":
        pool = pop.exp.arrangement.pool(pop.runner.num_train_clients)
        chosen = pop.rng("sample", rnd, member.slot).choice(len(pool), size=len(shared), replace=False)
        sampled = [pool[int(i)] for i in sorted(chosen)]
    betas = pop.local_vectors(member, rnd, len(sampled))
    copies = {cid: pop.copies.of(member.alpha, beta) for cid, beta in zip(sampled, betas, strict=True)}
    center = pop.copies.of(member.alpha, member.beta0)
    return MemberRound(member, betas, center, copies, broadcast_round(pop.exp, center, member.server, rnd, sampled))
