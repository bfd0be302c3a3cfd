"""The calibration behind policy.LanePolicy: a few vectorized steps of L lanes against plain steps of one client.

Both sides train client 0's round-1 Work (as the runtime's probe builds it, on its own RNG; every state and the
global RNG are left as they were) on the same random batch of the run's input shape: the lane side through the
runtime's own `PassRunner.group_step` (stacking the lanes' batches, the vmapped loss and gradient, the functional
optimizer), the plain side through the in-process pass optimizers and `LocalPass.step`, one step of every pass.
The two are timed interleaved (a loaded machine slows both alike), their medians compared; about CALIBRATION_S.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedhet.core.contract import LossStep
from fedhet.core.params import frozen
from fedhet.engine.local import PassOptimizers
from fedhet.runtimes.batched.data import ClientRng
from fedhet.runtimes.batched.policy import Measured
from fedhet.runtimes.batched.rule import LaneWork
from fedhet.runtimes.inprocess import FitJob

if TYPE_CHECKING:
    from fedhet.runtimes.batched.runtime import BatchedClients

CALIBRATION_S = 1.0  # the time a calibration aims at (at least MIN_ROUNDS rounds of each side)
MIN_ROUNDS, MAX_ROUNDS = 3, 25
SEQ_STEPS = 8  # plain steps per timed round (a plain step's time does not depend on the number of lanes)


def measure(rt: BatchedClients, batch_size: int, lanes: int) -> Measured:
    """Seconds per vectorized step of `lanes` lanes and per plain step, for `rt`'s method, model and device."""
    alg, exp, outer = rt.alg, rt.exp, ClientRng._capture()
    try:
        msg = alg.broadcast(alg.init_server(), exp.round_info(1), 0)
        lane = rt._lane(FitJob(alg, 0, msg, alg.init_client(0)), 1, ClientRng(exp.config.seed, 1, 0, "calibrate"))
        gen = torch.Generator().manual_seed(exp.config.seed)
        x = torch.randn((lanes, batch_size, *exp.data.input_shape), generator=gen).to(exp.device)
        y = torch.zeros((lanes, batch_size), dtype=torch.long, device=exp.device)
        vectorized = _lane_steps(rt, lane, x, y)
        plain = _plain_steps(lane, x[0], y[0])
        lane_s, seq_s = _interleaved(vectorized, plain, exp.device)
    finally:
        ClientRng._restore(outer)
    return Measured(lanes, lane_s, seq_s / SEQ_STEPS)


def _lane_steps(rt: BatchedClients, lane: LaneWork, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One vectorized step of every pass for x.shape[0] copies of `lane`."""
    lanes, dev = x.shape[0], x.device
    layout = rt._check([lane])
    state = {k: v.unsqueeze(0).expand(lanes, *v.shape).clone().to(dev) for k, v in lane.states.items()}
    tensors = {k: torch.utils._pytree.tree_map(lambda v: v.unsqueeze(0).expand(lanes, *v.shape).clone(),
                                               lane.tensors[k]) for k in layout.tensors}
    runners = [rt._runner([lane] * lanes, k, layout, [{} for _ in range(lanes)], state)
               for k in range(len(lane.passes))]
    drawn = {i: (x[i], y[i]) for i in range(lanes)}
    idx = list(range(lanes))

    def step() -> None:
        for runner in runners:
            runner.guarded_step(idx, drawn, tensors, dev)

    return step


def _plain_steps(lane: LaneWork, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """SEQ_STEPS in-process steps of every pass of `lane`'s own Work (as engine.local.run_pass takes them)."""
    optimizers = [PassOptimizers(p.optimizers, {}, "calibration") for p in lane.passes]

    def steps() -> None:
        for local_pass, opt in zip(lane.passes, optimizers, strict=True):
            assert isinstance(local_pass.step, LossStep)  # rule 1 was checked
            with frozen(local_pass.frozen):
                for module in local_pass.modules:
                    module.train()
                for _ in range(SEQ_STEPS):
                    float(local_pass.step(x, y, opt).detach())

    return steps


def _interleaved(a: Callable[[], None], b: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """Median seconds of `a` and of `b`, timed alternately after one warm-up call of each."""
    def timed(fn: Callable[[], None]) -> float:
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    timed(a), timed(b)  # warm-up (vmap's and the allocator's first-call costs)
    first = timed(a) + timed(b)
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(CALIBRATION_S / max(first, 1e-9))))
    times = [(timed(a), timed(b)) for _ in range(rounds)]
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
