"""One `LocalPass` of many clients ("lanes") in lock-step vectorized steps.

The lanes' state (every module field's parameters and buffers, `"field:name"`) and optimizer states are stacked
along a leading lane dimension. At step t every lane that still has batches draws its t-th batch from its own
stream (data.py: the very batches it would draw in-process). Lanes whose batches have the same size take the step
together in one vmapped call per `LossStep` stage (step.py): all lanes when every batch is full, the usual case;
otherwise one group per batch size (an epoch's last batch, a client with less data than the batch size), gathered
and scattered back by lane index. So the algorithm's own loss always sees exactly a lane's real batch (no padding,
which an opaque loss could not exclude), nothing is dropped, and a lane that has finished takes no part.
Lanes may differ in their optimizer's lr / momentum / weight decay (optim.for_lanes: per-lane values in the
state's "hp" slot) and, through their own streams, in step counts and batch sizes. A lane whose loss turns
non-finite is reported (`PassResult.diverged`); the other lanes' steps do not depend on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map

from fedhet.core.contract import LocalPass, LossStep, OptimSpec, PassStats
from fedhet.core.params import OptimState, frozen
from fedhet.runtimes.batched.data import Batch, BatchStream
from fedhet.runtimes.batched.optim import FunctionalOptimizer, OptState, Tensors, TensorTree, for_lanes
from fedhet.runtimes.batched.rule import Layout
from fedhet.runtimes.batched.step import RoutedWork, StepFn, stage_step


@dataclass
class PassResult:
    """Each lane's statistics, persisted optimizer states (torch state_dict format, by optimizer name) and
    whether a stage's loss became NaN / inf."""

    stats: list[PassStats]
    optim: list[dict[str, OptimState]]
    diverged: list[bool]


@dataclass
class Gathered:
    """Lanes `ix` of one step: their batches stacked, and the runner's lane-stacked state and tensors for them (the
    runner's own when `whole`, every lane in order; else copies); `pick` selects any other lane-stacked tensor."""

    ix: torch.Tensor
    whole: bool
    x: torch.Tensor
    y: torch.Tensor
    state: Tensors
    tensors: dict[str, TensorTree]

    def pick(self, v: torch.Tensor) -> torch.Tensor:
        return v if self.whole else v.index_select(0, self.ix)


@dataclass
class Optim:
    """One optimizer of the pass: its spec, functional twin, the state keys it trains and their stacked state."""

    spec: OptimSpec
    fn: FunctionalOptimizer
    keys: list[str]
    state: OptState


class PassRunner:
    """Runs lane 0's pass (`passes[0]`) for every lane, with each lane's own optimizer values (`passes[i]`);
    `state` (stacked, on the device) is updated in place."""

    def __init__(self, routed: RoutedWork, passes: Sequence[LocalPass], layout: Layout,
                 saved: Sequence[dict[str, OptimState]], state: Tensors) -> None:
        template = passes[0]
        if not isinstance(template.step, LossStep):
            raise TypeError("the batched runtime runs LossStep passes only (rule.check_passes)")
        self.routed, self.template, self.state, self.lanes = routed, template, state, len(saved)
        with frozen(template.frozen):  # requires_grad as the in-process pass sees it
            self.grad_keys = [layout.keys[id(p)] for f in layout.modules
                              for p in getattr(routed.work, f).parameters() if p.requires_grad]
            self.optims = {name: self._optim([p.optimizers[name] for p in passes], layout, saved, name)
                           for name in template.optimizers}
        self.steps: list[tuple[str, StepFn]] = []
        for loss_of, name in template.step.stages:
            o = self.optims[name]
            self.steps.append((name, stage_step(routed, loss_of, o.keys, o.fn, o.spec.grad_clip)))

    def _optim(self, specs: list[OptimSpec], layout: Layout, saved: Sequence[dict[str, OptimState]], name: str
               ) -> Optim:
        """Stacked optimizer state: fresh, or each lane's persisted torch state where it has one; the lanes'
        own lr / momentum / weight decay in its "hp" slot where they differ."""
        spec = specs[0]
        (fn, hp), keys = for_lanes(specs), [layout.keys[id(p)] for p in spec.params if p.requires_grad]
        params = {k: self.state[k] for k in keys}
        dev = next(iter(self.state.values())).device
        hp = None if hp is None else {n: v.to(dev) for n, v in hp.items()}
        if not spec.persist or all(name not in s for s in saved):
            return Optim(spec, fn, keys, fn.init(params, (self.lanes,), hp=hp))
        states = []
        for i, s in enumerate(saved):
            own = {k: v[i] for k, v in params.items()}
            own_hp = None if hp is None else {n: v[i] for n, v in hp.items()}
            states.append(fn.from_torch(s[name], own, own_hp) if name in s else fn.init(own, hp=own_hp))
        stacked = {slot: {k: torch.stack([st[slot][k] for st in states]) for k in states[0][slot]}
                   for slot in states[0]}
        return Optim(spec, fn, keys, stacked)

    def run(self, streams: Sequence[BatchStream], tensors: dict[str, TensorTree]) -> PassResult:
        """Every lane's steps (see the module docstring); a lane with a NaN / inf loss at any stage is marked
        diverged (the caller fails the fit or, for a tuning population, that member only)."""
        dev = next(iter(self.state.values())).device
        counts = [s.steps for s in streams]
        loss_sum = torch.zeros(self.lanes, dtype=torch.float64, device=dev)
        bad = torch.zeros(self.lanes, dtype=torch.bool, device=dev)
        examples = [0] * self.lanes
        with self.routed.guarded():
            for t in range(max(counts, default=0)):
                drawn = {i: streams[i].next() for i in range(self.lanes) if t < counts[i]}
                groups: dict[int, list[int]] = {}
                for i, (_, y) in drawn.items():
                    groups.setdefault(y.shape[0], []).append(i)
                    examples[i] += y.shape[0]
                for idx in groups.values():
                    loss, finite = self.group_step(idx, drawn, tensors, dev)
                    if len(idx) == self.lanes:  # every lane: no index tensor to build (a small model's step is ~ms)
                        loss_sum.add_(loss)
                        bad.logical_or_(~finite)
                    else:
                        ix = torch.tensor(idx, device=dev)
                        loss_sum.index_add_(0, ix, loss.to(torch.float64))
                        bad.index_fill_(0, ix[~finite], True)
        stats = [PassStats(loss=float(loss_sum[i]) / max(counts[i], 1), steps=counts[i], examples=examples[i])
                 for i in range(self.lanes)]
        return PassResult(stats, [self._persisted(i) for i in range(self.lanes)], bad.tolist())

    def gather(self, idx: list[int], batches: list[Batch], tensors: dict[str, TensorTree], dev: torch.device
               ) -> Gathered:
        """The lanes `idx` of one step (equal batch sizes, `batches` in their order): see `Gathered`."""
        ix = torch.tensor(idx, device=dev)
        whole = len(idx) == self.lanes
        x = torch.stack([b[0] for b in batches]).to(dev, non_blocking=True)
        y = torch.stack([b[1] for b in batches]).to(dev, non_blocking=True)
        if whole:
            return Gathered(ix, True, x, y, self.state, tensors)
        return Gathered(ix, False, x, y, {k: v.index_select(0, ix) for k, v in self.state.items()},
                        tree_map(lambda v: v.index_select(0, ix), tensors))

    def split(self, state: Tensors) -> tuple[Tensors, Tensors]:
        """A lane-stacked state as (the tensors the loss is differentiated by, the rest)."""
        trained = {k: state[k] for k in self.grad_keys}
        return trained, {k: v for k, v in state.items() if k not in trained}

    def group_step(self, idx: list[int], drawn: dict[int, Batch], tensors: dict[str, TensorTree], dev: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the lanes `idx` (equal batch sizes): every stage in turn; returns the reported (first
        stage's) loss and whether every stage's loss was finite, per lane. Inside `routed.guarded()` (rule 3)."""
        g = self.gather(idx, [drawn[i] for i in idx], tensors, dev)
        state = g.state
        opt = {n: (o.state if g.whole else tree_map(g.pick, o.state)) for n, o in self.optims.items()}
        changed: set[str] = set()
        reported, finite = None, torch.ones(len(idx), dtype=torch.bool, device=dev)
        for name, step in self.steps:
            new, updates, opt[name], loss = step(*self.split(state), g.tensors, opt[name], g.x, g.y)
            state.update(new)
            state.update(updates)
            changed |= set(new) | set(updates)
            reported = loss if reported is None else reported
            finite &= torch.isfinite(loss)
        for name, o in self.optims.items():
            if g.whole:
                o.state = opt[name]
            else:
                tree_map(lambda full, part: full.index_copy_(0, g.ix, part), o.state, opt[name])
        if not g.whole:
            for k in changed:
                self.state[k].index_copy_(0, g.ix, state[k])
        assert reported is not None  # a LossStep has at least one stage
        return reported, finite

    def guarded_step(self, idx: list[int], drawn: dict[int, Batch], tensors: dict[str, TensorTree], dev: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """`group_step` inside `routed.guarded()` (one dry step: runtime.py's probe)."""
        with self.routed.guarded():
            return self.group_step(idx, drawn, tensors, dev)

    def _persisted(self, i: int) -> dict[str, OptimState]:
        """Lane i's states of the optimizers marked `persist`, as torch state_dicts."""
        out = {}
        for name, o in self.optims.items():
            if o.spec.persist:
                own = {slot: {k: v[i].detach().cpu() for k, v in tensors.items()} for slot, tensors in o.state.items()}
                out[name] = o.fn.to_torch(own, o.keys)
        return out
