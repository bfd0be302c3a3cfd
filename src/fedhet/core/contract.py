"""The types of the algorithm contract: typed round and client contexts, client / server state, a fit's work,
optimizer specs and local passes.

An algorithm describes a round of local training as data (`LocalPass`es over its `Work`); the engine runs the
loop (fedhet.engine.local: batches, optimizers and their persistence, seeding, NaN checks, statistics). See
docs/design.md, "The algorithm contract".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from fedhet.config import TrainConfig
from fedhet.core.messages import Message
from fedhet.core.params import OptimState, StateDict
from fedhet.core.protocols import ClientSplits, SampleSet

if TYPE_CHECKING:  # only the type: importing the contract does not load the model zoo
    from fedhet.models.base import SplitModel


@dataclass(frozen=True)
class RoundInfo:
    """Where the run stands: this round (1-based), the run's total rounds, the federation's client count and the
    run seed (every random stream derives from it with `fedhet.core.seeding`)."""

    round: int
    rounds: int
    num_clients: int
    seed: int


@dataclass(frozen=True)
class ClientContext:
    """What a client knows while it trains or evaluates: who it is, the round, its data, its device, and the
    dataset's class names (public metadata, e.g. FedBiP's prompts; empty when unknown)."""

    client_id: int
    info: RoundInfo
    data: ClientSplits
    device: torch.device
    num_classes: int
    class_names: tuple[str, ...] = ()

    @property
    def round(self) -> int:
        return self.info.round

    @property
    def rounds(self) -> int:
        return self.info.rounds

    @property
    def num_clients(self) -> int:
        return self.info.num_clients


@dataclass(kw_only=True)
class ClientState:
    """What a client keeps between rounds (checkpointed, moved between runtimes). `local`: the model's keys
    that never leave the client (FedBN's BatchNorm); `optim`: optimizer states the engine persists under
    `train.persist_optimizer`, by optimizer name. Methods subclass it to add fields."""

    local: StateDict = field(default_factory=dict)
    optim: dict[str, OptimState] = field(default_factory=dict)


@dataclass(kw_only=True)
class ServerState:
    """What the server keeps between rounds: `model`, the shared part of the global model (empty when nothing
    of the network is shared), and `opt`, the server optimizer's state. Methods subclass it to add fields."""

    model: StateDict = field(default_factory=dict)
    opt: dict[str, torch.Tensor | int] = field(default_factory=dict)

    def facts(self) -> dict[str, Any]:  # Any: JSON-ready values for summary.json
        """Method-specific facts of a finished run for its summary.json, kept where checkpoints are not (FedBiP:
        the synthetic set's size and cost). Default: none."""
        return {}


@dataclass(kw_only=True)
class Work:
    """One fit call's working set, built by `Algorithm.start` and dropped after `Algorithm.finish`: the received
    message, the context and the model being trained. Methods subclass it for what else a fit needs (FedProx's
    anchor, Ditto's personal and reference models); nothing of a call stays on the algorithm instance."""

    msg: Message
    ctx: ClientContext
    model: SplitModel


@dataclass(frozen=True)
class OptimSpec:
    """An optimizer the engine builds for a pass: over `params` (those with requires_grad when the pass starts),
    `kind` sgd | adam | adamw, with `grad_clip` (max gradient norm) applied after `after_backward` (a gradient
    edit, e.g. SCAFFOLD's correction). `persist`: its state is kept in the client state between rounds.
    `betas`: Adam's / AdamW's moment decays. `lr_schedule(t)`: the factor on `lr` at this optimizer's step t of
    the pass (0, 1, ...; e.g. a warm-up then a linear decay), None: constant."""

    params: Sequence[nn.Parameter]
    kind: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    persist: bool = False
    after_backward: Callable[[], None] | None = None
    lr_schedule: Callable[[int], float] | None = None
    betas: tuple[float, float] = (0.9, 0.999)

    @classmethod
    def from_train(cls, params: Sequence[nn.Parameter], cfg: TrainConfig, lr: float | None = None,
                   persist: bool | None = None, after_backward: Callable[[], None] | None = None) -> OptimSpec:
        """The train config's optimizer (lr overridable); persisted when `persist` (default: the config's)."""
        return cls(params=params, kind=cfg.optimizer, lr=cfg.lr if lr is None else lr, momentum=cfg.momentum,
                   weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                   persist=cfg.persist_optimizer if persist is None else persist, after_backward=after_backward)


class Optimizers(Protocol):
    """The optimizers of a running pass, as a step function sees them."""

    def step(self, loss: torch.Tensor, name: str = "model") -> None:
        """NaN check, zero_grad, backward, gradient edit and clipping, then the optimizer `name` steps."""

    def step_each(self, losses: dict[str, torch.Tensor]) -> None:
        """Each optimizer steps on the gradient of its own loss w.r.t. its own parameters, all gradients taken
        before any parameter moves (simultaneous updates, e.g. FRAug's stage 2)."""


StepFn = Callable[[torch.Tensor, torch.Tensor, Optimizers], torch.Tensor]


@dataclass
class LocalPass:
    """One loop over mini-batches that the engine runs: `step(x, y, optimizers)` does the method's update and
    returns the loss to report. `train` sets the batch size and the amount of work (local_steps / local_epochs);
    `data` defaults to the client's training split; `modules` are put in train mode and `frozen` parameters
    have requires_grad off for the whole pass. The pass marked `report` gives the fit's train_loss and steps."""

    name: str
    step: StepFn
    optimizers: dict[str, OptimSpec]
    train: TrainConfig
    data: SampleSet | None = None
    modules: Sequence[nn.Module] = ()
    frozen: Sequence[nn.Parameter] = ()
    report: bool = True


@dataclass
class PassStats:
    """What one pass did: mean reported loss, optimizer steps (batches) and examples seen."""

    loss: float
    steps: int
    examples: int


@dataclass
class FitStats:
    """A fit's statistics: the reported pass's numbers, every pass by name."""

    loss: float = 0.0
    steps: int = 0
    examples: int = 0
    passes: dict[str, PassStats] = field(default_factory=dict)


@dataclass
class Deployment:
    """The model a client would use, plus passes the engine runs on it first (pFedAvg's fine-tuning);
    `batch_size` of evaluation (None: train.batch_size)."""

    model: nn.Module
    passes: Sequence[LocalPass] = ()
    batch_size: int | None = None


@dataclass
class NovelModel:
    """A held-out client's model as it adapts (engine/novel.py): `module` predicts, only `params` train;
    `part` names what they are (embedding, hypernetwork, personal, all)."""

    module: nn.Module
    params: list[nn.Parameter]
    part: str


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LossStep:
    """The usual step, as data: for each `(loss_of, optimizer name)` of `stages` in turn, that optimizer steps on
    `loss_of(x, y)` (the same batch); the first stage's loss is reported. One stage is `minimize`; several are
    simultaneous models trained on one batch (Ditto's tandem schedule). The batched runtime recognizes this type
    and vectorizes `loss_of` itself (runtimes/batched, docs/runtimes_batched.md "Which methods batch")."""

    stages: tuple[tuple[LossFn, str], ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a LossStep needs at least one (loss_of, optimizer name) stage")

    def __call__(self, x: torch.Tensor, y: torch.Tensor, optimizers: Optimizers) -> torch.Tensor:
        losses = []
        for loss_of, name in self.stages:
            loss = loss_of(x, y)
            optimizers.step(loss, name)
            losses.append(loss)
        return losses[0]


def minimize(loss_of: LossFn, name: str = "model") -> LossStep:
    """The usual step: one optimizer (`name`) steps on `loss_of(x, y)`; the loss is reported."""
    return LossStep(((loss_of, name),))


def loss_pass(model: nn.Module, loss_of: LossFn, train: TrainConfig, name: str = "local") -> LocalPass:
    """Local SGD of `model` on `loss_of(x, y)` with the train config's optimizer (named "model", persisted under
    `train.persist_optimizer`): FedAvg's pass, and the first pass of most methods."""
    return LocalPass(name, minimize(loss_of), {"model": OptimSpec.from_train(list(model.parameters()), train)}, train,
                     modules=(model,))
