"""One round's training step (sample, broadcast, fit, aggregate), shared by `RoundLoop` and anything that runs
several federations side by side (FedPop's population, docs/design_fedpop_runner.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fedhet.algorithms.base import AnyAlgorithm
from fedhet.core.contract import ServerState
from fedhet.core.dp import dp_aggregate
from fedhet.core.messages import Message, Reply, traffic
from fedhet.core.robust import check_clients
from fedhet.core.seeding import seeded
from fedhet.engine.attacks import attack_uploads, resolve_attack
from fedhet.engine.experiment import Experiment
from fedhet.engine.finite import DIVERGED_ADVICE, first_nonfinite
from fedhet.engine.sampling import sample_clients
from fedhet.errors import TrainingDivergedError

Fit = Callable[[int, dict[int, Message]], list[Reply]]


@dataclass
class TrainedRound:
    """The server state after aggregation, the clients' replies and the round's traffic per client."""

    server: ServerState
    replies: list[Reply]
    traffic: dict[str, float] = field(default_factory=dict)


def sample_round(exp: Experiment, num_train_clients: int, rnd: int) -> list[int]:
    """The clients that train in round `rnd` (held-out novel clients never do), drawn from (seed, round)."""
    cfg = exp.config
    pool = exp.arrangement.pool(num_train_clients)
    sampled = [pool[i] for i in sample_clients(cfg.seed, rnd, len(pool), cfg.server.fraction_fit,
                                               cfg.server.min_fit_clients)]
    check_clients(cfg.server, len(sampled))  # a robust rule's client count, before the round trains
    return sampled


def broadcast_round(exp: Experiment, alg: AnyAlgorithm, server: ServerState, rnd: int, sampled: list[int]
                    ) -> dict[int, Message]:
    """Each sampled client's message of round `rnd`."""
    info = exp.round_info(rnd)
    return {cid: alg.broadcast(server, info, cid) for cid in sampled}


def aggregate_round(exp: Experiment, alg: AnyAlgorithm, server: ServerState, rnd: int, messages: dict[int, Message],
                    replies: list[Reply], dp_seed: int | None = None) -> TrainedRound:
    """Aggregate the replies under the (seed, round) stream; a non-finite server state is a
    TrainingDivergedError. `dp_seed`: the seed of privacy.dp's noise (default the run's; a tuning member's own)."""
    flows = traffic(list(messages.values()), [r.message for r in replies])
    info, seed = exp.round_info(rnd), exp.config.seed
    replies = attack_uploads(resolve_attack(exp), server, replies)  # what attackers upload (engine/attacks.py)
    with seeded(seed, rnd, "aggregate"):  # privacy.dp: clipped, noised (core/dp.py)
        server = dp_aggregate(exp.config.privacy.dp, lambda s, r: alg.aggregate(s, r, info), server, replies,
                              seed if dp_seed is None else dp_seed, rnd)
    bad = first_nonfinite(server)
    if bad is not None:  # a finite last loss can still leave infinite weights: never commit them
        raise TrainingDivergedError(f"the server state {bad} became NaN/inf after aggregation in round {rnd}; "
                                    f"{DIVERGED_ADVICE}")
    return TrainedRound(server, replies, flows)


def fit_and_aggregate(exp: Experiment, alg: AnyAlgorithm, server: ServerState, rnd: int, sampled: list[int],
                      fit: Fit) -> TrainedRound:
    """Broadcast to `sampled`, train them with `fit` (an executor's `fit`, or one bound to per-client copies of
    the method), aggregate (`aggregate_round`)."""
    messages = broadcast_round(exp, alg, server, rnd, sampled)
    return aggregate_round(exp, alg, server, rnd, messages, fit(rnd, messages))
