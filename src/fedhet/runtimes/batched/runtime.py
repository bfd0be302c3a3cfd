"""`BatchedClients`: the client executor of `run.runtime: batched`, a drop-in for `InProcessClients`.

A chunk of sampled clients is fitted as the engine fits one (engine/local.py), with the passes vectorized:
each client's `Algorithm.start` and `Algorithm.passes` run on that client's RNG (as inside in-process's
`seeded(seed, round, client, "fit")`), the rule (rule.py) is checked on all of them, lane 0's passes run for
every lane (lanes.py, step.py: the algorithm's own `loss_of`, re-routed to each lane's tensors), then each
client's trained tensors are loaded back into its Work and `Algorithm.finish` builds its reply and new state
(client states stay in the in-process format, so checkpoints move between the runtimes). Evaluation is
inherited from `InProcessClients` (per client, sequential). A method the rule refuses raises one ConfigError
naming `run.runtime=inprocess`, checked on client 0 before training starts (and on every chunk); there is no
fallback to sequential training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch.utils.data import Dataset

from fedhet.algorithms.base import Algorithm
from fedhet.core.contract import ClientState, FitStats, LocalPass
from fedhet.core.messages import Message, Reply
from fedhet.core.seeding import FIT, client_stream
from fedhet.engine.experiment import Experiment
from fedhet.errors import FedhetError
from fedhet.runtimes.batched.data import BatchStream, ClientRng
from fedhet.runtimes.batched.lanes import PassRunner
from fedhet.runtimes.batched.memory import MB, clients_per_chunk, default_budget_bytes, lane_bytes
from fedhet.runtimes.batched.rule import (
    GuardedRead,
    LaneWork,
    Layout,
    check_passes,
    layout_of,
    refusal,
    shape_key,
    snapshot,
)
from fedhet.runtimes.batched.step import Cache, RoutedWork, functional_copies
from fedhet.runtimes.inprocess import InProcessClients

T = TypeVar("T")


class BatchedClients(InProcessClients):
    """Runs the sampled clients' local training as vectorized steps; interface of `InProcessClients`."""

    def __init__(self, exp: Experiment) -> None:
        super().__init__(exp)
        self.cache: Cache = {}
        self.chunk_size = self._chunk_size(self._probe())

    def _probe(self) -> int:
        """Client 0's round-1 fit through the rule, one dry vectorized step on zeros included (the global RNG
        and every state are left as they were); returns the number of module fields of its Work."""
        alg, outer = self.alg, ClientRng._capture()
        try:
            msg = alg.broadcast(alg.init_server(), self.exp.round_info(1), 0)
            lane = self._lane(0, 1, msg, alg.init_client(0), ClientRng(self.exp.config.seed, 1, 0, "probe"))
            layout = self._check([lane])
            state = {k: v.unsqueeze(0).clone() for k, v in lane.states.items()}
            x = torch.zeros((1, 2, *self.exp.data.input_shape), device=self.exp.device)
            y = torch.zeros((1, 2), dtype=torch.long, device=self.exp.device)
            for local_pass in lane.passes:
                runner = self._runner(lane, local_pass, layout, [{}], state)
                tensors = {k: _stack([v]) for k, v in lane.tensors.items()}
                self._guarded(runner.group_step, [0], {0: (x[0], y[0])}, tensors, self.exp.device)
        finally:
            ClientRng._restore(outer)
        return len(layout.modules)

    def _guarded(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a vectorized step; a guarded read or a torch.func limitation becomes the method's refusal."""
        try:
            return fn(*args)
        except GuardedRead as e:
            raise refusal(self.alg.name, str(e)) from e
        except RuntimeError as e:
            if "vmap" not in str(e) and "functorch" not in str(e):
                raise
            raise refusal(self.alg.name, f"its loss does not run under torch.func.vmap ({str(e).splitlines()[0]}) "
                          "(rule 7)") from e

    def _chunk_size(self, modules: int) -> int:
        """Clients per chunk from `run.batched_memory_mb` / `run.batched_max_clients` (memory.py): a lane per
        module field of the Work."""
        run, exp, train = self.exp.config.run, self.exp, self.exp.config.train
        slots = 2 if train.optimizer in ("adam", "adamw") else int(train.momentum != 0)
        per_lane = lane_bytes(self.alg.parts.new(), exp.data.input_shape, train.batch_size, slots)
        budget = int(run.batched_memory_mb * MB) if run.batched_memory_mb else default_budget_bytes(exp.device)
        return clients_per_chunk(per_lane, max(modules, 1), budget, run.batched_max_clients)

    def fit(self, rnd: int, messages: dict[int, Message],
            algorithms: Mapping[int, Algorithm[Any, Any, Any]] | None = None) -> list[Reply]:
        """Local training of the given clients, chunk by chunk; states replace the old ones only at the end.
        Per-client copies of the method (`algorithms`) and validation checks (fedhet tune) are not laned yet: a
        FedhetError asks for the in-process runtime."""
        if algorithms or self.check_split:
            raise FedhetError("the batched runtime trains every client with the run's own method and settings; "
                              "per-client hyperparameters and validation checks (fedhet tune) need "
                              "run.runtime=inprocess")
        cids = list(messages)
        replies: dict[int, Reply] = {}
        new_states = dict(self.states)
        for start in range(0, len(cids), self.chunk_size):
            for cid, reply, state in self._fit_chunk(rnd, cids[start:start + self.chunk_size], messages):
                replies[cid], new_states[cid] = reply, state
        self.states = new_states
        return [replies[cid] for cid in cids]

    def _lane(self, cid: int, rnd: int, msg: Message, state: ClientState, rng: ClientRng) -> LaneWork:
        """Client `cid`'s Work and passes, on its RNG, snapshotted before the next client's `start`."""
        ctx = self.exp.context(cid, rnd, self.train_data[cid])
        with rng.active():
            work = self.alg.start(msg, state, ctx)
            return snapshot(work, list(self.alg.passes(work)))

    def _check(self, lanes: list[LaneWork]) -> Layout:
        layout = layout_of(self.alg.name, lanes)
        check_passes(self.alg.name, lanes, layout)
        return layout

    def _runner(self, lane0: LaneWork, local_pass: LocalPass, layout: Layout, saved: list[dict[str, Any]],
                state: dict[str, torch.Tensor]) -> PassRunner:
        """The pass's runner, with its modules in train mode as `engine.local.run_pass` puts them."""
        for module in local_pass.modules:
            module.train()
        routed = RoutedWork(lane0.work, layout, functional_copies(lane0.work, layout, self.cache))
        return PassRunner(routed, local_pass, layout, saved, state)

    def _fit_chunk(self, rnd: int, cids: list[int], messages: dict[int, Message]
                   ) -> list[tuple[int, Reply, ClientState]]:
        """Train one chunk (module docstring), its clients grouped by the shape of their Work (MOON's first round
        has no previous model); returns each client's reply and new state, in the chunk's order."""
        rngs = [ClientRng(*client_stream(self.exp.config.seed, rnd, cid, FIT)) for cid in cids]
        lanes = [self._lane(cid, rnd, messages[cid], self.states[cid], rng)
                 for cid, rng in zip(cids, rngs, strict=True)]
        groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for i, lane in enumerate(lanes):
            groups.setdefault(shape_key(lane.work), []).append(i)
        done: dict[int, tuple[int, Reply, ClientState]] = {}
        for idx in groups.values():
            results = self._train(rnd, [cids[i] for i in idx], [rngs[i] for i in idx], [lanes[i] for i in idx])
            done.update({result[0]: result for result in results})
        return [done[cid] for cid in cids]

    def _train(self, rnd: int, cids: list[int], rngs: list[ClientRng], lanes: list[LaneWork]
               ) -> list[tuple[int, Reply, ClientState]]:
        """Train lanes of one Work shape: the rule, every pass vectorized, then each client's `finish`."""
        dev = self.exp.device
        layout = self._check(lanes)
        state = {k: _stack([lane.states[k] for lane in lanes]).to(dev) for k in lanes[0].states}
        tensors = {k: _stack([lane.tensors[k] for lane in lanes]) for k in layout.tensors}
        stats = [FitStats() for _ in cids]
        optim = [dict(self.states[cid].optim) for cid in cids]
        for k, local_pass in enumerate(lanes[0].passes):
            runner = self._runner(lanes[0], local_pass, layout, [self.states[cid].optim for cid in cids], state)
            streams = [BatchStream(rng, _data_of(lane.passes[k], self.train_data[cid].train), lane.passes[k].train)
                       for cid, rng, lane in zip(cids, rngs, lanes, strict=True)]
            labels = [f"{self.alg.name}{'' if local_pass.name == 'local' else ' ' + local_pass.name} client {cid} "
                      f"round {rnd}" for cid in cids]
            result = self._guarded(runner.run, streams, tensors, labels)
            for i, done in enumerate(result.stats):
                optim[i].update(result.optim[i])
                stats[i].passes[local_pass.name] = done
                if local_pass.report:
                    stats[i].loss, stats[i].steps, stats[i].examples = done.loss, done.steps, done.examples
        return [self._finish(i, cid, lanes[i], rngs[i], state, stats[i], optim[i]) for i, cid in enumerate(cids)]

    def _finish(self, i: int, cid: int, lane: LaneWork, rng: ClientRng, state: dict[str, torch.Tensor],
                stats: FitStats, optim: dict[str, Any]) -> tuple[int, Reply, ClientState]:
        """Lane i's trained tensors back into its Work's modules, then the algorithm's own `finish`."""
        with torch.no_grad():
            for f in [f.name for f in dataclasses.fields(lane.work)]:
                module = getattr(lane.work, f)
                if isinstance(module, torch.nn.Module):
                    for n, t in [*module.named_parameters(), *module.named_buffers()]:
                        t.copy_(state[f"{f}:{n}"][i])
        with rng.active():
            reply, new_state = self.alg.finish(lane.work, self.states[cid], stats)
        new_state = dataclasses.replace(new_state, optim=optim)
        return cid, Reply(cid, reply, self.train_data[cid].num_train), new_state


def _stack(values: list[Any]) -> Any:
    """Stack lanes' tensors (or tuples of tensors) along a new leading dimension."""
    if isinstance(values[0], torch.Tensor):
        return torch.stack(values)
    return tuple(torch.stack([v[j] for v in values]) for j in range(len(values[0])))


def _data_of(local_pass: LocalPass, default: Dataset[Any]) -> Dataset[Any]:
    """The pass's data: its own, else the client's training split (as `engine.local.run_pass`)."""
    return local_pass.data if local_pass.data is not None else default
