"""Lanes of different batch sizes in one vectorized pass, by splitting batches (`run.batched_accumulate`).

Where a pass's loss is a mean over its batch's samples plus terms that do not depend on the batch (cross-entropy;
FedProx's proximal term: `splits_batches`), a batch's gradient is the size-weighted mean of the gradients of its
parts. So lanes whose batch sizes share a divisor m (the paper's FedPop space 8, 16, ..., 128: m = 8) take one
vmapped call per micro-batch of m rows, all together, instead of one group per batch size (lanes.py): each lane
adds its weighted micro-batch gradient to an accumulator and, when its batch is complete, clips it (the
optimizer's `grad_clip`) and steps its optimizer. Each lane still draws exactly its in-process batches
(data.py); only the float summation order of its gradients differs, so the result equals in-process up to
rounding (tested to 1e-5 after a pass), not bit for bit: a switch, off by default. A pass with several stages,
or with BatchNorm in train mode (whose statistics are per batch), runs as lanes.py's `PassRunner` (exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

import torch
from torch.func import vmap
from torch.utils._pytree import tree_map

from fedhet.algorithms.base import Algorithm, AnyAlgorithm
from fedhet.core.contract import LocalPass, LossStep, PassStats
from fedhet.core.params import OptimState
from fedhet.runtimes.batched.data import Batch, BatchStream
from fedhet.runtimes.batched.lanes import PassResult, PassRunner
from fedhet.runtimes.batched.optim import Tensors, TensorTree, clip_grad_norm, expand_lanes
from fedhet.runtimes.batched.rule import Layout
from fedhet.runtimes.batched.step import RoutedWork, stage_grads

MIN_ROWS = 4  # a smaller common divisor: micro-batches of a few rows, many more calls (not measured): groups
Part = tuple[torch.Tensor, torch.Tensor, float, bool]  # x, y, share of its batch, last part of its batch


def splits_batches(alg: AnyAlgorithm) -> bool:
    """Whether the method's loss may be split across micro-batches: its declared `capabilities.loss_is_batch_mean`,
    else true only where neither `loss` nor `passes` is overridden (FedAvg's single-stage cross-entropy pass)."""
    for cls in type(alg).__mro__:
        capabilities = vars(cls).get("capabilities")
        if capabilities is not None and capabilities.loss_is_batch_mean is not None:
            return bool(capabilities.loss_is_batch_mean)
        if "loss" in vars(cls) or "passes" in vars(cls):
            return cls is Algorithm
    return False


def micro_rows(algs: Sequence[AnyAlgorithm]) -> int | None:
    """The micro-batch size for jobs of these method copies (the gcd of their batch sizes), or None where they
    share one batch size, a method's loss cannot be split, or the gcd is below MIN_ROWS."""
    sizes = {a.train_cfg.batch_size for a in algs}
    rows = gcd(*sizes)
    if len(sizes) < 2 or rows < MIN_ROWS or not all(splits_batches(a) for a in algs):
        return None
    return rows


def can_accumulate(routed: RoutedWork, passes: Sequence[LocalPass], rows: int) -> bool:
    """A single-stage pass without BatchNorm in train mode whose lanes' batch sizes differ (else lanes.py's one
    group is exact) and are multiples of `rows`."""
    step, sizes = passes[0].step, {p.train.batch_size for p in passes}
    bn_training = any(layer.training for fm in routed.functional.values() for layer in fm.layers)
    return (isinstance(step, LossStep) and len(step.stages) == 1 and not bn_training and len(sizes) > 1
            and all(b % rows == 0 for b in sizes))


class MicroStream:
    """A lane's batches, in parts of `rows` rows (the last part of a batch may be shorter)."""

    def __init__(self, stream: BatchStream, rows: int) -> None:
        self.stream, self.rows = stream, rows
        self._parts: list[Batch] = []
        self._size = 0

    @property
    def remaining(self) -> bool:
        return bool(self._parts) or self.stream.drawn < self.stream.steps

    def next(self) -> Part:
        if not self._parts:
            x, y = self.stream.next()
            self._size = y.shape[0]
            self._parts = list(zip(x.split(self.rows), y.split(self.rows), strict=True))[::-1]
        x, y = self._parts.pop()
        return x, y, y.shape[0] / self._size, not self._parts


class AccumulatingRunner(PassRunner):
    """`PassRunner` whose lanes take micro-batch steps of `rows` rows together (module docstring)."""

    def __init__(self, routed: RoutedWork, passes: Sequence[LocalPass], layout: Layout,
                 saved: Sequence[dict[str, OptimState]], state: Tensors, rows: int) -> None:
        super().__init__(routed, passes, layout, saved, state)
        step = self.template.step
        assert isinstance(step, LossStep) and len(step.stages) == 1, "a single-stage LossStep (can_accumulate)"
        (loss_of, self.name), = step.stages
        self.rows, self.grads_fn = rows, stage_grads(routed, loss_of, self.optims[self.name].keys, None)

    def run(self, streams: Sequence[BatchStream], tensors: dict[str, TensorTree]) -> PassResult:
        """Every lane's pass in micro-batches; statistics as `PassRunner.run` (a batch's loss is the weighted sum
        of its parts' losses)."""
        dev = next(iter(self.state.values())).device
        acc = {k: torch.zeros_like(self.state[k]) for k in self.optims[self.name].keys}
        parts = [MicroStream(s, self.rows) for s in streams]
        loss_sum = torch.zeros(self.lanes, dtype=torch.float64, device=dev)
        batch_loss = torch.zeros(self.lanes, dtype=torch.float64, device=dev)
        examples = [0] * self.lanes
        with self.routed.guarded():
            while drawn := {i: p.next() for i, p in enumerate(parts) if p.remaining}:
                groups: dict[int, list[int]] = {}
                for i, (_, y, _, _) in drawn.items():
                    groups.setdefault(y.shape[0], []).append(i)
                    examples[i] += y.shape[0]
                for idx in groups.values():
                    self._accumulate(idx, drawn, tensors, acc, batch_loss)
                done = [i for i, part in drawn.items() if part[3]]
                self._update(done, acc)
                loss_sum[done] += batch_loss[done]
                batch_loss[done] = 0.0
        bad = ~torch.isfinite(loss_sum)
        stats = [PassStats(loss=float(loss_sum[i]) / max(s.steps, 1), steps=s.steps, examples=examples[i])
                 for i, s in enumerate(streams)]
        return PassResult(stats, [self._persisted(i) for i in range(self.lanes)], bad.tolist())

    def _accumulate(self, idx: list[int], drawn: dict[int, Part], tensors: dict[str, TensorTree],
                    acc: dict[str, torch.Tensor], batch_loss: torch.Tensor) -> None:
        """The lanes `idx` (equal part sizes): acc += share * gradient, batch_loss += share * loss."""
        g = self.gather(idx, [drawn[i][:2] for i in idx], tensors, batch_loss.device)
        share = torch.tensor([drawn[i][2] for i in idx], device=batch_loss.device)
        grads, updates, loss = self.grads_fn(*self.split(g.state), g.tensors, g.x, g.y)
        assert not updates, "BatchNorm in train mode runs as PassRunner (can_accumulate)"
        for k, grad in grads.items():
            weighted = grad * expand_lanes(share, grad).to(grad.dtype)
            if g.whole:
                acc[k] += weighted
            else:
                acc[k].index_add_(0, g.ix, weighted)
        batch_loss[g.ix] += share.to(torch.float64) * loss.to(torch.float64)

    def _update(self, done: list[int], acc: dict[str, torch.Tensor]) -> None:
        """The lanes whose batch is complete: clip, step the optimizer, empty their accumulators. For a subset of
        the lanes, every lane's update is computed and only theirs kept (`torch.where`; no gather and scatter)."""
        if not done:
            return
        o = self.optims[self.name]
        grads = acc
        if o.spec.grad_clip is not None:
            grads = vmap(lambda g: clip_grad_norm(g, o.spec.grad_clip))(grads)  # type: ignore[arg-type]
        whole = len(done) == self.lanes
        params = {k: self.state[k] for k in o.keys}
        new_params, new_state = o.fn.update(params, grads, o.state, donate=whole)
        if whole:
            o.state = new_state
            self.state.update(new_params)
            for g in acc.values():
                g.zero_()
            return
        keep = torch.zeros(self.lanes, dtype=torch.bool, device=next(iter(acc.values())).device)
        keep[done] = True

        def chosen(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
            return torch.where(expand_lanes(keep, new), new, old)

        o.state = tree_map(chosen, new_state, o.state)
        self.state.update({k: chosen(v, params[k]) for k, v in new_params.items()})
        for g in acc.values():
            g.masked_fill_(expand_lanes(keep, g), 0.0)
