"""`BatchedClients`: the client executor of `run.runtime: batched`, a drop-in for `InProcessClients`.

A chunk of sampled clients is fitted as the engine fits one (engine/local.py), with the passes vectorized:
each client's `Algorithm.start` and `Algorithm.passes` run on that client's RNG (as inside in-process's
`seeded(seed, round, client, "fit")`), the rule (rule.py) is checked on all of them, lane 0's passes run for
every lane (lanes.py, step.py: the algorithm's own `loss_of`, re-routed to each lane's tensors), then each
client's trained tensors are loaded back into its Work and `Algorithm.finish` builds its reply and new state
(client states stay in the in-process format, so checkpoints move between the runtimes). Evaluation is
inherited from `InProcessClients` (per client, sequential). A method the rule refuses raises one ConfigError
naming `run.runtime=inprocess`, checked on client 0 before training starts (and on every chunk); there is no
fallback to sequential training for a refused method. Where lanes would not pay (policy.py: measured on this
machine for this model and batch, or a group of fewer than `run.batched_min_lanes` clients) the group's clients
train one after another with the in-process code, which gives the in-process numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch
from torch.utils._pytree import tree_map

from fedhet.algorithms.base import AnyAlgorithm
from fedhet.core.contract import FitStats, LocalPass, LossStep
from fedhet.core.messages import Message, Reply
from fedhet.core.params import OptimState, frozen
from fedhet.core.protocols import SampleSet
from fedhet.core.seeding import client_stream
from fedhet.engine.experiment import Experiment
from fedhet.engine.finite import DIVERGED_ADVICE
from fedhet.engine.local import add_check
from fedhet.errors import FedhetError, TrainingDivergedError
from fedhet.runtimes.batched import calibrate
from fedhet.runtimes.batched.accumulate import AccumulatingRunner, can_accumulate, micro_rows
from fedhet.runtimes.batched.data import BatchStream, ClientRng
from fedhet.runtimes.batched.lanes import PassRunner
from fedhet.runtimes.batched.memory import MB, clients_per_chunk, default_budget_bytes, lane_bytes
from fedhet.runtimes.batched.optim import TensorTree
from fedhet.runtimes.batched.policy import LanePolicy
from fedhet.runtimes.batched.rule import (
    GuardedRead,
    LaneWork,
    Layout,
    check_passes,
    lane_group,
    layout_of,
    named_tensors,
    refusal,
    shape_key,
    snapshot,
)
from fedhet.runtimes.batched.step import Cache, RoutedWork, functional_copies
from fedhet.runtimes.inprocess import FitJob, FitOutcome, InProcessClients

T = TypeVar("T")


class BatchedClients(InProcessClients):
    """Runs the sampled clients' local training as vectorized steps; interface of `InProcessClients`."""

    def __init__(self, exp: Experiment) -> None:
        super().__init__(exp)
        self.cache: Cache = {}
        self.chunk_sizes: dict[int, int] = {}  # batch size -> clients per chunk (the estimate builds a model)
        self.modules = self._probe()
        model: dict[str, object] = {
            "method": self.alg.name, "optimizer": exp.config.train.optimizer, "input": list(exp.data.input_shape),
            "shapes": [[n, list(p.shape), str(p.dtype)] for n, p in self.alg.parts.new().named_parameters()]}
        self.policy = LanePolicy(exp.config.run.batched_min_lanes, exp.device, model,
                                 lambda batch_size, lanes: calibrate.measure(self, batch_size, lanes))

    @property
    def chunk_size(self) -> int:
        """Clients per chunk at the run's own batch size."""
        return self._chunk_size(self.exp.config.train.batch_size)

    def _probe(self) -> int:
        """Client 0's round-1 fit through the rule, one dry vectorized step on zeros included (the global RNG
        and every state are left as they were); returns the number of module fields of its Work."""
        alg, outer = self.alg, ClientRng._capture()
        try:
            msg = alg.broadcast(alg.init_server(), self.exp.round_info(1), 0)
            lane = self._lane(FitJob(alg, 0, msg, alg.init_client(0)), 1,
                              ClientRng(self.exp.config.seed, 1, 0, "probe"))
            layout = self._check([lane])
            state = {k: v.unsqueeze(0).clone() for k, v in lane.states.items()}
            x = torch.zeros((1, 2, *self.exp.data.input_shape), device=self.exp.device)
            y = torch.zeros((1, 2), dtype=torch.long, device=self.exp.device)
            for k in range(len(lane.passes)):
                runner = self._runner([lane], k, layout, [{}], state)
                tensors = {k: _stack([v]) for k, v in lane.tensors.items()}
                self._guarded(lane, runner.guarded_step, [0], {0: (x[0], y[0])}, tensors, self.exp.device)
        finally:
            ClientRng._restore(outer)
        return len(layout.modules)

    def _guarded(self, lane: LaneWork, fn: Callable[..., T], *args: object) -> T:
        """Run a vectorized step of lanes whose lane 0 is `lane`. A guarded read (rule 5) or a torch.func
        limitation becomes the method's refusal, and so does any other exception when lane 0's losses run
        in-process (rule 7: it is the vectorization that fails); else the loss itself fails and the error is its."""
        try:
            return fn(*args)
        except GuardedRead as e:
            raise refusal(self.alg.name, str(e)) from e
        except FedhetError:
            raise
        except Exception as e:
            text = str(e)
            if "vmap" not in text and "functorch" not in text and not self._runs_in_process(lane):
                raise
            raise refusal(self.alg.name, f"its loss does not run under torch.func.vmap ({type(e).__name__}: "
                          f"{(text.splitlines() or [''])[0]}), though it runs in-process (rule 7)") from e

    def _runs_in_process(self, lane: LaneWork) -> bool:
        """Whether every stage's loss of `lane`'s passes runs as the in-process runtime calls it (on zeros)."""
        x = torch.zeros((2, *self.exp.data.input_shape), device=self.exp.device)
        y = torch.zeros(2, dtype=torch.long, device=self.exp.device)
        try:
            for local_pass in lane.passes:
                assert isinstance(local_pass.step, LossStep)  # rule 1 was checked
                for module in local_pass.modules:
                    module.train()
                with frozen(local_pass.frozen):
                    for loss_of, _ in local_pass.step.stages:
                        loss_of(x, y)
        except Exception:  # noqa: BLE001 - any failure: the loss does not run in-process either
            return False
        return True

    def _chunk_size(self, batch_size: int) -> int:
        """Clients per chunk from `run.batched_memory_mb` / `run.batched_max_clients` (memory.py): a lane per
        module field of the Work, sized for the chunk's largest batch; estimated once per batch size."""
        if batch_size not in self.chunk_sizes:
            run, exp, train = self.exp.config.run, self.exp, self.exp.config.train
            slots = 2 if train.optimizer in ("adam", "adamw") else 1
            per_lane = lane_bytes(self.alg.parts.new(), exp.data.input_shape, batch_size, slots)
            budget = int(run.batched_memory_mb * MB) if run.batched_memory_mb else default_budget_bytes(exp.device)
            self.chunk_sizes[batch_size] = clients_per_chunk(per_lane, max(self.modules, 1), budget,
                                                             run.batched_max_clients)
        return self.chunk_sizes[batch_size]

    def fit(self, rnd: int, messages: dict[int, Message],
            algorithms: Mapping[int, AnyAlgorithm] | None = None) -> list[Reply]:
        """Local training of the given clients, chunk by chunk; states replace the old ones only at the end.
        `algorithms`: a client's own copy of the method (`with_hparams`, as in-process); copies that differ only
        in laned values (rule.lane_group) share lanes. A NaN / inf loss fails the round, as in-process."""
        jobs = [FitJob((algorithms or {}).get(cid, self.alg), cid, msg, self.states[cid])
                for cid, msg in messages.items()]
        outcomes = self.fit_jobs(rnd, jobs)
        bad = [f"client {job.cid}" for job, out in zip(jobs, outcomes, strict=True) if out.reply is None]
        if bad:
            raise TrainingDivergedError(f"loss became NaN/inf in batched local training of {self.alg.name} round "
                                        f"{rnd} ({', '.join(bad)}); {DIVERGED_ADVICE}")
        self.states = {**self.states, **{job.cid: out.state for job, out in zip(jobs, outcomes, strict=True)}}
        return [Reply(job.cid, out.reply, self.train_data[job.cid].num_train)
                for job, out in zip(jobs, outcomes, strict=True) if out.reply is not None]

    def fit_jobs(self, rnd: int, jobs: list[FitJob]) -> list[FitOutcome]:
        """Fit any clients of any federations sharing this experiment (a tuning population's members, each client
        with its own method copy and state), nothing stored; outcomes in the jobs' order. Jobs are grouped by
        batch size (a value that cannot be laned; with `run.batched_accumulate`, where the methods allow it, all
        jobs form one group whose lanes split their batches: accumulate.py); a group where lanes pay (policy.py)
        trains as lanes in memory-sized chunks, another one job after another with the in-process code. A job whose
        loss became NaN / inf comes back with no reply and its old state."""
        by_size: dict[int, list[int]] = {}
        rows = micro_rows([job.alg for job in jobs]) if self.exp.config.run.batched_accumulate else None
        for i, job in enumerate(jobs):  # with `rows`, one group: lanes split their batches (accumulate.py)
            by_size.setdefault(0 if rows else job.alg.train_cfg.batch_size, []).append(i)
        done: dict[int, FitOutcome] = {}
        for batch_size, idx in by_size.items():
            largest = batch_size or max(jobs[i].alg.train_cfg.batch_size for i in idx)
            size = self._chunk_size(largest)
            if not self.policy.lanes_pay(largest, min(len(idx), size)):
                done.update((i, self.fit_job(rnd, jobs[i])) for i in idx)
                continue
            for start in range(0, len(idx), size):
                part = idx[start:start + size]
                done.update(zip(part, self._fit_chunk(rnd, [jobs[i] for i in part], rows), strict=True))
        return [done[i] for i in range(len(jobs))]

    def _lane(self, job: FitJob, rnd: int, rng: ClientRng) -> LaneWork:
        """The job's Work and passes, on its client's RNG, snapshotted before the next client's `start`."""
        ctx = self.exp.context(job.cid, rnd, job.data if job.data is not None else self.train_data[job.cid])
        with rng.active():
            work = job.alg.start(job.msg, job.state, ctx)
            return snapshot(work, list(job.alg.passes(work)))

    def _check(self, lanes: list[LaneWork]) -> Layout:
        layout = layout_of(self.alg.name, lanes)
        check_passes(self.alg.name, lanes, layout)
        return layout

    def _runner(self, lanes: list[LaneWork], k: int, layout: Layout, saved: list[dict[str, OptimState]],
                state: dict[str, torch.Tensor], rows: int | None = None) -> PassRunner:
        """Pass k's runner, with its modules in train mode as `engine.local.run_pass` puts them; with `rows`,
        one that splits batches into parts of `rows` where the pass allows it (accumulate.py)."""
        for module in lanes[0].passes[k].modules:
            module.train()
        routed = RoutedWork(lanes[0].work, layout, functional_copies(lanes[0].work, layout, self.cache))
        passes = [lane.passes[k] for lane in lanes]
        if rows and can_accumulate(routed, passes, rows):
            return AccumulatingRunner(routed, passes, layout, saved, state, rows)
        return PassRunner(routed, passes, layout, saved, state)

    def _fit_chunk(self, rnd: int, jobs: list[FitJob], rows: int | None = None) -> list[FitOutcome]:
        """Train one chunk (module docstring), its jobs grouped by the shape of their Work (MOON's first round has
        no previous model) and their method copy's `lane_group`; outcomes in the chunk's order."""
        rngs = [ClientRng(*client_stream(self.exp.config.seed, rnd, job.cid, job.purpose)) for job in jobs]
        with ClientRng.one_after_another():
            lanes = [self._lane(job, rnd, rng) for job, rng in zip(jobs, rngs, strict=True)]
        groups: dict[tuple[object, ...], list[int]] = {}
        for i, lane in enumerate(lanes):
            groups.setdefault((shape_key(lane.work), lane_group(jobs[i].alg)), []).append(i)
        done: dict[int, FitOutcome] = {}
        for idx in groups.values():
            results = self._train(rnd, [jobs[i] for i in idx], [rngs[i] for i in idx], [lanes[i] for i in idx], rows)
            done.update(zip(idx, results, strict=True))
        return [done[i] for i in range(len(jobs))]

    def _train(self, rnd: int, jobs: list[FitJob], rngs: list[ClientRng], lanes: list[LaneWork],
               rows: int | None = None) -> list[FitOutcome]:
        """Train lanes of one Work shape: the rule, every pass vectorized, then each client's `finish`."""
        dev = self.exp.device
        layout = self._check(lanes)
        state = {k: _stack([lane.states[k] for lane in lanes]).to(dev) for k in lanes[0].states}
        tensors = {k: _stack([lane.tensors[k] for lane in lanes]) for k in layout.tensors}
        stats = [FitStats() for _ in jobs]
        optim = [dict(job.state.optim) for job in jobs]
        diverged = [False] * len(jobs)
        for k, local_pass in enumerate(lanes[0].passes):
            runner = self._runner(lanes, k, layout, [job.state.optim for job in jobs], state, rows)
            streams = [BatchStream(rng, _data_of(lane.passes[k], lane.work.ctx.data.train), lane.passes[k].train)
                       for rng, lane in zip(rngs, lanes, strict=True)]
            result = self._guarded(lanes[0], runner.run, streams, tensors)
            for i, done in enumerate(result.stats):
                optim[i].update(result.optim[i])
                stats[i].passes[local_pass.name] = done
                diverged[i] = diverged[i] or result.diverged[i]
                if local_pass.report:
                    stats[i].loss, stats[i].steps, stats[i].examples = done.loss, done.steps, done.examples
        with ClientRng.one_after_another():
            return [FitOutcome(None, job.state) if diverged[i] else
                    self._finish(i, job, lanes[i], rngs[i], state, stats[i], optim[i]) for i, job in enumerate(jobs)]

    def _finish(self, i: int, job: FitJob, lane: LaneWork, rng: ClientRng, state: dict[str, torch.Tensor],
                stats: FitStats, optim: dict[str, OptimState]) -> FitOutcome:
        """Lane i's trained tensors back into its Work's modules, then the algorithm's own `finish` (and, with a
        `check_split`, the trained model's loss on it, as `engine.local.fit_client`)."""
        with torch.no_grad():
            for f in [f.name for f in dataclasses.fields(lane.work)]:
                module = getattr(lane.work, f)
                if isinstance(module, torch.nn.Module):
                    for n, t in named_tensors(module):
                        t.copy_(state[f"{f}:{n}"][i])
        with rng.active(last=True):
            reply, new_state = job.alg.finish(lane.work, job.state, stats)
            split = job.check or self.check_split
            if split:
                ctx = lane.work.ctx  # the context `start` received: the job's view of the client's data
                add_check(reply, job.alg, lane.work, ctx, getattr(ctx.data, split))
        return FitOutcome(reply, dataclasses.replace(new_state, optim=optim))


def _stack(values: list[TensorTree]) -> TensorTree:
    """Stack lanes' tensors (or tuples / lists / dicts of tensors) along a new leading dimension."""
    return tree_map(lambda *lanes: torch.stack(lanes), values[0], *values[1:])


def _data_of(local_pass: LocalPass, default: SampleSet) -> SampleSet:
    """The pass's data: its own, else the client's training split (as `engine.local.run_pass`)."""
    return local_pass.data if local_pass.data is not None else default
