"""The in-process runtime: every client runs sequentially in this process, its state kept in a dict."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass

from fedhet.algorithms.base import AnyAlgorithm
from fedhet.core.contract import ClientState
from fedhet.core.messages import Message, Reply
from fedhet.core.protocols import SampleSet
from fedhet.core.seeding import EVALUATE, FIT, client_stream, reseed, rngs_kept
from fedhet.data.federated import ClientData
from fedhet.engine.attacks import eval_split, poison_of, resolve_attack
from fedhet.engine.experiment import Experiment
from fedhet.engine.local import evaluate_client, fit_client
from fedhet.errors import TrainingDivergedError
from fedhet.yaml_input import JSONDict


@dataclass
class FitJob:
    """One client's fit in one federation: the method copy it trains with, its id, message and state; `purpose`
    keys its random stream (seeding.client_stream: FIT, or FedPop's "finetune"), `data` is the client data its
    context holds (None: the runner's training view of the client) and `check` the split of it the trained model
    is scored on (None: the runner's `check_split`)."""

    alg: AnyAlgorithm
    cid: int
    msg: Message
    state: ClientState
    purpose: str = FIT
    data: ClientData | None = None
    check: str | None = None


@dataclass
class FitOutcome:
    """A job's reply (None: its loss became NaN / inf) and new client state (the old one when it diverged)."""

    reply: Message | None
    state: ClientState


class InProcessClients:
    """Runs fit / evaluate for the sampled clients one after another, seeding each by (seed, round, client)."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.alg = exp.algorithm
        self.train_data = exp.arrangement.train
        self.states: dict[int, ClientState] = {i: self.alg.init_client(i) for i in range(len(self.train_data))}
        self.check_split: str | None = None  # "val": fit replies carry check_loss / check_accuracy on it
        self.attack = resolve_attack(exp)  # attack: the attackers poison their batches (engine/attacks.py)

    @property
    def num_train_clients(self) -> int:
        return len(self.train_data)

    def fit(self, rnd: int, messages: dict[int, Message],
            algorithms: Mapping[int, AnyAlgorithm] | None = None) -> list[Reply]:
        """Local training of the given clients; their new states replace the old ones only at the end.

        `algorithms`: a client's own copy of the method (`algorithms.base.with_hparams`: FedPop's beta^k), else the
        run's. With `check_split` set (e.g. "val"), each reply carries the trained model's loss on that split."""
        replies, new_states = [], dict(self.states)
        with rngs_kept():  # one save / restore of the RNGs for the round: each client reseeds them all
            for cid, msg in messages.items():
                out, new_states[cid] = self.fit_one(rnd, cid, (algorithms or {}).get(cid, self.alg), msg,
                                                    self.states[cid], kept=True)
                replies.append(Reply(cid, out, self.train_data[cid].num_train))
        self.states = new_states
        return replies

    def fit_one(self, rnd: int, cid: int, alg: AnyAlgorithm, msg: Message, state: ClientState,
                purpose: str = FIT, data: ClientData | None = None, check: str | None = None, kept: bool = False
                ) -> tuple[Message, ClientState]:
        """One client's fit on its (seed, round, client, purpose) RNG; `state` is not modified. `data`: the client
        data its context holds (None: the runner's training view); `check`: the split of it the trained model is
        scored on (None: `check_split`); `kept`: the caller keeps the global RNG states (`seeding.rngs_kept`), the
        client reseeds them (`seeding.reseed`) and leaves them drawn."""
        ctx = self.exp.context(cid, rnd, data if data is not None else self.train_data[cid])
        split = check or self.check_split
        with nullcontext() if kept else rngs_kept():
            reseed(*client_stream(self.exp.config.seed, rnd, cid, purpose))
            return fit_client(alg, msg, state, ctx, check=getattr(ctx.data, split) if split else None,
                              poison=poison_of(self.attack, cid))

    def fit_job(self, rnd: int, job: FitJob) -> FitOutcome:
        """One job fitted by `fit_one`; a NaN / inf loss gives no reply and the job's old state."""
        try:
            reply, state = self.fit_one(rnd, job.cid, job.alg, job.msg, job.state, job.purpose, job.data, job.check)
        except TrainingDivergedError:
            return FitOutcome(None, job.state)
        return FitOutcome(reply, state)

    def fit_jobs(self, rnd: int, jobs: list[FitJob]) -> list[FitOutcome]:
        """Fit any clients of any federations sharing this experiment, one after another, nothing stored;
        outcomes in the jobs' order (the batched runtime trains them as lanes)."""
        return [self.fit_job(rnd, job) for job in jobs]

    def evaluate(self, rnd: int, messages: dict[int, Message], split: str) -> dict[str, dict[str, float]]:
        """Metrics of each client in `messages` (its deployed model) on its own split ('test', 'val', or the
        backdoor's 'triggered': engine/attacks.py)."""
        results = {}
        with rngs_kept():  # one save / restore for all: each client reseeds the RNGs
            for cid in sorted(messages):
                client = self.exp.data.clients[cid]
                dataset: SampleSet | None = eval_split(self.attack, client, split)
                if dataset is None:
                    continue
                state = self.states[self.exp.arrangement.state_of[cid]]
                reseed(*client_stream(self.exp.config.seed, rnd, cid, EVALUATE))
                results[client.name] = evaluate_client(self.alg, messages[cid], state, self.exp.context(cid, rnd),
                                                       dataset)
        return results

    def begin_round(self, rnd: int) -> None:
        """Nothing to prepare: the states are here."""

    def on_disk(self) -> None:
        """Nothing to track: the checkpoint holds the states themselves."""

    def checkpoint_config(self, config: JSONDict) -> JSONDict:
        return config

    def get_states(self) -> dict[int, ClientState]:
        return self.states

    def set_states(self, states: dict[int, ClientState]) -> None:
        self.states = dict(states)

