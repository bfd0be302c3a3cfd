"""Train many "lanes" (one model on one client's batches for one pass) in lock-step vectorized steps.

A lane is what one call of `train_local` does in-process: a start state, a mini-batch stream, a loss
(cross-entropy, plus a proximal term with weight mu towards an anchor) and an optimizer. `train_lanes` stacks
the lanes' parameters, buffers and optimizer states along a leading dimension, then for t = 0 .. T-1
(T = the most steps any lane takes) draws every lane's t-th batch, pads the batches to one size and runs the
vmapped step (step.py). Ragged clients are handled by masking, never by dropping data:
  - a lane with fewer steps is inactive (active = 0) once it is done: its state is carried through
    unchanged, and its padding batch is never looked at;
  - a smaller batch (the last one of an epoch, or a client with less data than the batch size) is padded with
    zeros whose sample mask is 0: they count neither in the loss nor in BatchNorm's statistics.
Lanes that share a stream (Ditto's tandem schedule: w and v step on the same batch) get the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedhet.core.contract import PassStats
from fedhet.core.params import StateDict
from fedhet.engine.finite import DIVERGED_ADVICE
from fedhet.errors import TrainingDivergedError
from fedhet.runtimes.batched.data import Batch, BatchStream, stack_batches
from fedhet.runtimes.batched.optim import FunctionalOptimizer, OptState
from fedhet.runtimes.batched.step import FunctionalModel, StepFn


@dataclass
class Lane:
    """One model trained on one client's batches for one pass."""

    init: StateDict  # every parameter and buffer at the start of the pass
    stream: BatchStream
    anchor: StateDict | None = None  # trainable parameters the proximal term pulls towards (None: the start)
    mu: float = 0.0  # weight of (mu / 2) * ||w - anchor||^2
    optim: dict | None = None  # a torch.optim state_dict to continue from (train.persist_optimizer)
    label: str = "lane"  # names the lane in errors


@dataclass
class LaneResult:
    """A lane's final state (CPU, in the order of `Lane.init`), its optimizer state and training stats."""

    state: StateDict
    optim: dict | None
    stats: PassStats


def _stack(dicts: Sequence[dict[str, torch.Tensor]], keys: Sequence[str], device: torch.device
           ) -> dict[str, torch.Tensor]:
    return {k: torch.stack([d[k] for d in dicts]).to(device) for k in keys}


def _stack_opt(optimizer: FunctionalOptimizer, lanes: Sequence[Lane], params: dict[str, torch.Tensor]
               ) -> OptState:
    """Stacked optimizer states: fresh ones, or each lane's saved torch state where it has one."""
    if all(lane.optim is None for lane in lanes):
        return optimizer.init(params, (len(lanes),))
    states = []
    for i, lane in enumerate(lanes):
        own = {k: v[i] for k, v in params.items()}
        states.append(optimizer.from_torch(lane.optim, own) if lane.optim is not None else optimizer.init(own))
    return {slot: {k: torch.stack([s[slot][k] for s in states]) for k in states[0][slot]} for slot in states[0]}


class LaneTrainer:
    """Runs `train_lanes` with one model structure, optimizer and (vmapped) step function."""

    def __init__(self, model: FunctionalModel, optimizer: FunctionalOptimizer, step: StepFn,
                 device: torch.device, use_prox: bool) -> None:
        self.model, self.optimizer, self.step, self.device = model, optimizer, step, device
        self.use_prox = use_prox

    def train(self, lanes: Sequence[Lane], keep_optim: bool = False) -> list[LaneResult]:
        """Train every lane for its own number of steps (vectorized, masked); see the module docstring."""
        dev, names = self.device, self.model.param_names
        params = _stack([lane.init for lane in lanes], names, dev)
        buffers = _stack([lane.init for lane in lanes], self.model.buffer_names, dev)
        opt_state = _stack_opt(self.optimizer, lanes, params)
        anchor = _stack([lane.anchor or lane.init for lane in lanes], names, dev) if self.use_prox else {}
        mu = torch.tensor([lane.mu for lane in lanes], dtype=torch.float32, device=dev)
        steps = [lane.stream.steps for lane in lanes]
        loss_sum = torch.zeros(len(lanes), dtype=torch.float64, device=dev)
        bad = torch.zeros(len(lanes), dtype=torch.bool, device=dev)
        examples = [0] * len(lanes)
        like: Batch | None = None
        for t in range(max(steps, default=0)):
            drawn: dict[int, Batch] = {}
            items: list[Batch | None] = []
            for i, lane in enumerate(lanes):
                if t >= steps[i]:
                    items.append(None)
                    continue
                key = id(lane.stream)
                if key not in drawn:
                    drawn[key] = lane.stream.next()
                items.append(drawn[key])
                examples[i] += len(drawn[key][1])
            like = like or next(b for b in items if b is not None)
            x, y, mask = stack_batches(items, like)
            active = torch.tensor([t < s for s in steps], device=dev)
            padded = None if bool(mask.all()) else mask.to(dev, non_blocking=True)
            params, buffers, opt_state, loss = self.step(
                params, buffers, opt_state, anchor, mu, x.to(dev, non_blocking=True), y.to(dev, non_blocking=True),
                padded, None if t < min(steps) else active)
            loss_sum += torch.where(active, loss.to(torch.float64), 0.0)
            bad |= active & ~torch.isfinite(loss)
        self._check(lanes, bad)
        return [self._result(i, lane, params, buffers, opt_state, loss_sum[i], steps[i], examples[i], keep_optim)
                for i, lane in enumerate(lanes)]

    def _check(self, lanes: Sequence[Lane], bad: torch.Tensor) -> None:
        """The NaN / inf guard of `engine.local.check_finite`, once per pass instead of per step (no sync)."""
        if bool(bad.any()):
            which = ", ".join(lane.label for lane, b in zip(lanes, bad.tolist(), strict=True) if b)
            raise TrainingDivergedError(
                f"loss became NaN/inf in batched local training ({which}); {DIVERGED_ADVICE}")

    def _result(self, i: int, lane: Lane, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                opt_state: OptState, loss_sum: torch.Tensor, steps: int, examples: int, keep_optim: bool
                ) -> LaneResult:
        final = {**params, **buffers}
        state = {k: final[k][i].detach().to("cpu", copy=True) for k in lane.init}
        optim = None
        if keep_optim:
            own = {slot: {k: v[i].detach().cpu() for k, v in tensors.items()} for slot, tensors in opt_state.items()}
            optim = self.optimizer.to_torch(own, self.model.param_names)
        stats = PassStats(loss=float(loss_sum) / max(steps, 1), steps=steps, examples=examples)
        return LaneResult(state, optim, stats)
