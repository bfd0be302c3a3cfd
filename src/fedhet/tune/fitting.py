"""Training a tuning population's round: every live member's active clients, each with its own method copy
(Concat(alpha_i, beta_i^k)), message and state, fitted by the runner's `fit_jobs` (runtimes/inprocess.py): one
after another in-process, or at once as lanes of the batched runtime (`run.runtime: batched`; design:
docs/design_fedpop_runner.md §4), where members and clients that differ only in laned values (the local
optimizer's lr / momentum / weight decay, epochs, batch size, FedProx's mu; runtimes/batched/rule.lane_group)
share one vectorized step. Aggregation stays per member (population.py). The result per member is the same on
both runtimes, to float rounding (tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedhet.algorithms.base import AnyAlgorithm
from fedhet.core.contract import ClientState
from fedhet.core.messages import Message, Reply
from fedhet.runtimes.inprocess import FitJob, InProcessClients
from fedhet.tune.member import Member
from fedhet.tune.space import HPVector

CHECK_LOSS = "check_loss"  # the reply scalar fit_client(check=...) adds: the locally trained model's val loss
# a member's fitted round: its replies and its sampled clients' new states, or why its training diverged
Fitted = tuple[list[Reply], dict[int, ClientState]] | str


@dataclass
class MemberRound:
    """One member's round before training: its local vectors, the method copies its clients train with, the
    copy it aggregates with (its centre beta^0) and the messages it broadcast."""

    member: Member
    betas: list[HPVector]
    center: AnyAlgorithm
    copies: dict[int, AnyAlgorithm]
    messages: dict[int, Message]


def fit_members(runner: InProcessClients, rnd: int, plans: list[MemberRound],
                states_of: Callable[[Member], dict[int, ClientState]]) -> dict[int, Fitted]:
    """Every plan's clients fitted by `runner.fit_jobs`; per member slot, its replies and new client states, or
    the divergence message when any of its clients' losses became NaN / inf (that member only)."""
    jobs: list[FitJob] = []
    for plan in plans:
        states = states_of(plan.member)
        jobs += [FitJob(plan.copies[cid], cid, msg, states[cid]) for cid, msg in plan.messages.items()]
    outcomes = iter(runner.fit_jobs(rnd, jobs))
    fitted: dict[int, Fitted] = {}
    for plan in plans:
        mine = [(cid, next(outcomes)) for cid in plan.messages]
        bad = [cid for cid, out in mine if out.reply is None]
        if bad:
            fitted[plan.member.slot] = f"loss became NaN/inf in local training of clients {bad} in round {rnd}"
            continue
        replies = [Reply(cid, out.reply, runner.train_data[cid].num_train) for cid, out in mine
                   if out.reply is not None]
        fitted[plan.member.slot] = replies, {cid: out.state for cid, out in mine}
    return fitted
