"""The engine's local loop: one client's fit as fedjax's client_init / client_step / client_final.

`fit_client` calls `Algorithm.start` (the fit's `Work`), runs each `LocalPass` of `Algorithm.passes` (builds
its optimizers, restores and saves the persisted ones, puts its modules in train mode, freezes what it
freezes, draws its mini-batches from the RNG the runtime seeded by (seed, round, client), checks every loss
for NaN / inf, counts steps and examples), then `Algorithm.finish` (the reply and the new client state).
Algorithms never write this loop; they supply the step.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from fedhet.algorithms.base import AnyAlgorithm
from fedhet.config import TrainConfig
from fedhet.core.contract import ClientContext, ClientState, FitStats, LocalPass, OptimSpec, PassStats, Work, minimize
from fedhet.core.messages import Message
from fedhet.core.optim import build_optimizer, make_optimizer  # noqa: F401  (make_optimizer: engine.local's API)
from fedhet.core.params import OptimState, frozen
from fedhet.core.protocols import SampleSet
from fedhet.engine.attacks import Poison
from fedhet.engine.batching import batches
from fedhet.engine.evaluation import evaluate
from fedhet.engine.finite import DIVERGED_ADVICE, check_finite
from fedhet.losses.classification import cross_entropy
from fedhet.losses.descent import descend


class PassOptimizers:
    """The optimizers of one running pass (`fedhet.core.contract.Optimizers`)."""

    def __init__(self, specs: dict[str, OptimSpec], saved: dict[str, OptimState], where: str) -> None:
        self.specs, self.where = specs, where
        self.optims = {name: build_optimizer(spec) for name, spec in specs.items()}
        self.steps = dict.fromkeys(specs, 0)  # optimizer steps taken in this pass (for `lr_schedule`)
        for name, spec in specs.items():
            if spec.persist and name in saved:  # torch aliases loaded buffers: load a copy
                self.optims[name].load_state_dict(copy.deepcopy(saved[name]))

    def step(self, loss: torch.Tensor, name: str = "model") -> None:
        where = self.where if name == "model" else f"{self.where} ({name})"
        descend(self.optims[name], loss, where, DIVERGED_ADVICE, before_step=lambda: self._prepare(name))
        self.steps[name] += 1

    def step_each(self, losses: dict[str, torch.Tensor]) -> None:
        for name, loss in losses.items():
            check_finite(loss, f"{self.where} ({name})")
        grads = {name: torch.autograd.grad(loss, list(self.specs[name].params), retain_graph=True, allow_unused=True)
                 for name, loss in losses.items()}
        for name, gs in grads.items():
            for param, g in zip(self.specs[name].params, gs, strict=True):
                param.grad = g
            self._prepare(name)
            self.optims[name].step()
            self.steps[name] += 1

    def _prepare(self, name: str) -> None:
        """With the gradients in place, before the optimizer `name` steps: the gradient edit, clipping, the
        scheduled learning rate."""
        spec = self.specs[name]
        if spec.after_backward is not None:
            spec.after_backward()
        if spec.grad_clip is not None:
            nn.utils.clip_grad_norm_(spec.params, spec.grad_clip)
        if spec.lr_schedule is not None:
            for group in self.optims[name].param_groups:
                group["lr"] = spec.lr * spec.lr_schedule(self.steps[name])

    def persisted(self) -> dict[str, OptimState]:
        """Copies of the states of the optimizers marked `persist`."""
        return {name: copy.deepcopy(self.optims[name].state_dict()) for name, spec in self.specs.items()
                if spec.persist}


def run_pass(local_pass: LocalPass, saved: dict[str, OptimState], where: str, default_data: SampleSet,
             device: torch.device, poison: Poison | None = None) -> tuple[PassStats, dict[str, OptimState]]:
    """Run one pass over its mini-batches; returns its statistics and its persisted optimizer states. `poison`:
    what an attacker does to each batch of its own training data (engine/attacks.py; not to a pass's own data)."""
    with frozen(local_pass.frozen):
        optimizers = PassOptimizers(local_pass.optimizers, saved, where)
        for module in local_pass.modules:
            module.train()
        data = local_pass.data if local_pass.data is not None else default_data
        poison = poison if local_pass.data is None else None
        total, steps, seen = 0.0, 0, 0
        for x, y in batches(data, local_pass.train, device=device):
            x, y = poison(x, y) if poison is not None else (x, y)
            total += float(local_pass.step(x, y, optimizers).detach())
            steps, seen = steps + 1, seen + len(y)
    return PassStats(loss=total / max(steps, 1), steps=steps, examples=seen), optimizers.persisted()


def where_of(alg: AnyAlgorithm, ctx: ClientContext, local_pass: LocalPass) -> str:
    """How a NaN message names the place: method, pass, client, round."""
    part = "" if local_pass.name == "local" else f" {local_pass.name}"
    return f"{alg.name}{part} client {ctx.client_id} round {ctx.round}"


def fit_client(alg: AnyAlgorithm, msg: Message, state: ClientState, ctx: ClientContext,
               check: SampleSet | None = None, poison: Poison | None = None) -> tuple[Message, ClientState]:
    """One client's local training from the received `msg`: start, passes, finish. `state` is not modified.

    `check`: a split to evaluate the locally trained model on (FedPop's score, the validation loss of w_i^k
    before aggregation); its loss and accuracy join the reply's scalars as `check_loss` / `check_accuracy`.
    It runs on a forked RNG, so training and every later draw are the same with or without it. `poison`: an
    attacker's edit of each batch of its training data (engine/attacks.py)."""
    work = alg.start(msg, state, ctx)
    stats, optim = FitStats(), dict(state.optim)
    for local_pass in alg.passes(work):
        done, saved = run_pass(local_pass, state.optim, where_of(alg, ctx, local_pass), ctx.data.train, ctx.device,
                               poison)
        optim.update(saved)
        stats.passes[local_pass.name] = done
        if local_pass.report:
            stats.loss, stats.steps, stats.examples = done.loss, done.steps, done.examples
    reply, new_state = alg.finish(work, state, stats)
    if check is not None:
        add_check(reply, alg, work, ctx, check)
    return reply, dataclasses.replace(new_state, optim=optim)


def add_check(reply: Message, alg: AnyAlgorithm, work: Work, ctx: ClientContext, check: SampleSet) -> None:
    """`check_loss` / `check_accuracy` of the locally trained model on `check` into the reply's scalars, on a
    forked RNG (FedPop's score; every runtime's fit with a check split)."""
    with torch.random.fork_rng(devices=[]):
        metrics = evaluate(work.model, check, ctx.device, batch_size=alg.train_cfg.batch_size,
                           classes=ctx.data.classes)
    reply.scalars.update(check_loss=metrics["loss"], check_accuracy=metrics["accuracy"])


def deployed_model(alg: AnyAlgorithm, msg: Message, state: ClientState, ctx: ClientContext
                   ) -> tuple[nn.Module, int]:
    """The model the client deploys (after the deployment's own passes) and its evaluation batch size."""
    deployment = alg.deploy(msg, state, ctx)
    for local_pass in deployment.passes:
        run_pass(local_pass, {}, where_of(alg, ctx, local_pass), ctx.data.train, ctx.device)
    return deployment.model, deployment.batch_size or alg.train_cfg.batch_size


def evaluate_client(alg: AnyAlgorithm, msg: Message, state: ClientState, ctx: ClientContext,
                    dataset: SampleSet) -> dict[str, float]:
    """Metrics of the client's deployed model on one of its splits."""
    model, batch_size = deployed_model(alg, msg, state, ctx)
    return evaluate(model, dataset, ctx.device, batch_size=batch_size, classes=ctx.data.classes)


def train_local(model: nn.Module, dataset: SampleSet, cfg: TrainConfig, device: torch.device,
                loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy,
                where: str = "local training", lr: float | None = None) -> PassStats:
    """One pass of local SGD on a single model (benchmarks and tests): the engine's loop, nothing else."""
    local_pass = LocalPass("local", minimize(lambda x, y: loss_fn(model, x, y)),
                           {"model": OptimSpec.from_train(list(model.parameters()), cfg, lr, persist=False)},
                           cfg, data=dataset, modules=(model,))
    return run_pass(local_pass, {}, where, dataset, device)[0]
