"""`BatchedClients`: the client executor of `run.runtime: batched`, a drop-in for `InProcessClients`.

Local training of the sampled clients runs as vectorized lanes (lanes.py), in chunks of clients that fit the
memory budget (memory.py); everything else is the algorithm's own code, per client, as in-process:
`client_model` assembles each client's start model from the message and its state, `reply` builds the
message, the local keys (FedBN's BatchNorm) and Ditto's personal model go back into the client state in the
in-process format, so checkpoints move between the two runtimes. Evaluation is inherited from
`InProcessClients` (per client, sequential).

Which methods: those whose class declares `Algorithm.batched_step` itself (FedAvg, FedProx, FedBN, Ditto);
any other raises a ConfigError naming `run.runtime=inprocess`, before training starts. There is no
fallback to sequential training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fedhet.algorithms import Algorithm, ClientState
from fedhet.algorithms.base import BatchedStep
from fedhet.config import TrainConfig
from fedhet.core.contract import FitStats
from fedhet.core.messages import Message, Reply
from fedhet.core.params import StateDict, load_partial, state_of
from fedhet.engine.experiment import Experiment
from fedhet.errors import ConfigError
from fedhet.runtimes.batched.data import BatchStream, ClientRng
from fedhet.runtimes.batched.lanes import Lane, LaneResult, LaneTrainer
from fedhet.runtimes.batched.memory import MB, clients_per_chunk, default_budget_bytes, lane_bytes
from fedhet.runtimes.batched.optim import Adam, optimizer_for
from fedhet.runtimes.batched.step import FunctionalModel, vmapped_step
from fedhet.runtimes.inprocess import InProcessClients


def batched_step_of(alg: Algorithm[Any, Any, Any]) -> BatchedStep:
    """The algorithm's declared batched step, or a ConfigError that names the runtime to use instead."""
    declared = "batched_step" in vars(type(alg))
    spec = alg.batched_step() if declared else None
    if spec is None:
        inherited = "" if declared else " (an inherited declaration does not count: the subclass may change the step)"
        raise ConfigError(f"method '{alg.name}' cannot run on run.runtime=batched: {type(alg).__name__} does not "
                          f"declare a batched local step{inherited}. Run it with run.runtime=inprocess.")
    return spec


@dataclass
class _Job:
    """One sampled client of a chunk: its id, message, state (copied) and start model."""

    cid: int
    msg: Message
    state: ClientState
    init: StateDict
    rng: ClientRng


class BatchedClients(InProcessClients):
    """Runs the sampled clients' local training as vectorized steps; interface of `InProcessClients`."""

    def __init__(self, exp: Experiment) -> None:
        super().__init__(exp)
        cfg = exp.config
        self.spec = batched_step_of(self.alg)
        self.train_cfg: TrainConfig = cfg.train
        self.model = FunctionalModel.of(self.alg.parts.new())
        self.optimizer = optimizer_for(cfg.train)
        personal = self.spec.personal
        use_prox = self.spec.prox_mu > 0 or (personal is not None and personal.lam > 0)
        step = vmapped_step(self.model, self.optimizer, cfg.train.grad_clip, use_prox, donate=True)
        self.trainer = LaneTrainer(self.model, self.optimizer, step, exp.device, use_prox)
        self.chunk_size = self._chunk_size()

    def _chunk_size(self) -> int:
        """Clients per chunk from `run.batched_memory_mb` / `run.batched_max_clients` (memory.py)."""
        run, exp = self.exp.config.run, self.exp
        slots = 2 if isinstance(self.optimizer, Adam) else int(self.train_cfg.momentum != 0)
        per_lane = lane_bytes(self.alg.parts.new(), exp.data.input_shape, self.train_cfg.batch_size, slots)
        budget = int(run.batched_memory_mb * MB) if run.batched_memory_mb else default_budget_bytes(exp.device)
        lanes = 2 if self.spec.personal is not None and self.spec.personal.tandem else 1  # lanes trained together
        return clients_per_chunk(per_lane, lanes, budget, run.batched_max_clients)

    def fit(self, rnd: int, messages: dict[int, Message]) -> list[Reply]:
        """Local training of the given clients, chunk by chunk; states replace the old ones only at the end."""
        cids = list(messages)
        replies: dict[int, Reply] = {}
        new_states = dict(self.states)
        for start in range(0, len(cids), self.chunk_size):
            for job, reply in self._fit_chunk(rnd, cids[start:start + self.chunk_size], messages):
                replies[job.cid] = reply
                new_states[job.cid] = job.state
        self.states = new_states
        return [replies[cid] for cid in cids]

    def _jobs(self, rnd: int, cids: list[int], messages: dict[int, Message]) -> list[_Job]:
        """Each client's start model (as `Algorithm.fit` assembles it) and its in-process RNG."""
        seed = self.exp.config.seed
        jobs = []
        for cid in cids:
            state = self.states[cid]
            init = state_of(self.alg.client_model(messages[cid], state))
            jobs.append(_Job(cid, messages[cid], state, init, ClientRng(seed, rnd, cid, "fit")))
        return jobs

    def _fit_chunk(self, rnd: int, cids: list[int], messages: dict[int, Message]) -> list[tuple[_Job, Reply]]:
        """Train one chunk: the global model's lanes (and Ditto's personal lanes), then build replies/states."""
        cfg, spec, persist = self.train_cfg, self.spec, self.train_cfg.persist_optimizer
        jobs = self._jobs(rnd, cids, messages)
        names = self.model.param_names
        lanes = [Lane(init=j.init, stream=BatchStream(j.rng, self.train_data[j.cid].train, cfg),
                      mu=spec.prox_mu, optim=j.state.optim.get("model") if persist else None,
                      label=f"{self.alg.name} client {j.cid} round {rnd}") for j in jobs]
        personal = spec.personal
        if personal is None:
            results, personal_results = self.trainer.train(lanes, keep_optim=persist), None
        else:
            def personal_lane(j: _Job, stream: BatchStream) -> Lane:
                saved: StateDict | None = getattr(j.state, "personal", None)  # Ditto's personal model
                start = saved if saved is not None else j.init
                return Lane(init=dict(start), stream=stream, anchor={k: j.init[k] for k in names}, mu=personal.lam,
                            label=f"{self.alg.name} personal model, client {j.cid} round {rnd}")

            if personal.tandem:
                both = self.trainer.train(lanes + [personal_lane(j, lane.stream) for j, lane in zip(jobs, lanes,
                                                                                                 strict=True)],
                                          keep_optim=persist)
                results, personal_results = both[:len(jobs)], both[len(jobs):]
            else:
                results = self.trainer.train(lanes, keep_optim=persist)
                personal_results = self.trainer.train(
                    [personal_lane(j, BatchStream(j.rng, self.train_data[j.cid].train, personal.train)) for j in jobs])
        out = []
        for i, job in enumerate(jobs):
            pres = personal_results[i] if personal_results is not None else None
            out.append((job, self._finish(job, results[i], pres)))
        return out

    def _finish(self, job: _Job, result: LaneResult, personal: LaneResult | None) -> Reply:
        """As `Algorithm.fit` ends: the reply from the trained model; local keys, optimizer, personal model kept."""
        model = self.alg.client_model(job.msg, job.state)
        load_partial(model, result.state)
        changes: dict[str, Any] = {"local": state_of(model, self.alg.parts.local_keys())}
        if self.train_cfg.persist_optimizer and result.optim is not None:
            changes["optim"] = {**job.state.optim, "model": result.optim}
        if personal is not None:
            changes["personal"] = personal.state
        job.state = dataclasses.replace(job.state, **changes)
        stats = FitStats(loss=result.stats.loss, steps=result.stats.steps, examples=result.stats.examples)
        return Reply(job.cid, self.alg.parts.reply(model, stats), self.train_data[job.cid].num_train)
