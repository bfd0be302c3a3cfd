"""A method's model bookkeeping: the seeded initial model, which of its keys are shared, reusable buffers."""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedhet.core.contract import FitStats
from fedhet.core.messages import Message
from fedhet.core.params import StateDict, load_partial, state_of
from fedhet.models import SplitModel


class ModelParts:
    """The initial model (`template`, `init_state`), its `shared` keys and the rest (local), and `spare`
    model objects reused across calls and clients (their contents are undefined between calls)."""

    def __init__(self, template: SplitModel, shared: set[str]) -> None:
        self.template = template
        self.shared = shared
        self.init_state = state_of(template)
        # the trainable floating-point parameters, in the model's order: what SCAFFOLD's control variates, FedDyn's
        # dynamic regularizer and FedNova's normalized update act on (buffers are averaged as in FedAvg)
        self.trainable = [k for k, p in template.named_parameters() if p.requires_grad and p.is_floating_point()]
        self._spares: dict[str, SplitModel] = {}

    def new(self) -> SplitModel:
        """A fresh copy of the (seeded) initial model on the run's device."""
        return copy.deepcopy(self.template)

    def spare(self, slot: str) -> SplitModel:
        """The model object of `slot` ("workspace", "reference", ...), built once from the initial model; callers
        load every weight they rely on before use."""
        if slot not in self._spares:
            self._spares[slot] = self.new()
        return self._spares[slot]

    def zeros(self, keys: list[str]) -> StateDict:
        """A zero tensor shaped like the initial model's for each of `keys`."""
        return {k: torch.zeros_like(self.init_state[k]) for k in keys}

    def local_keys(self) -> set[str]:
        """Keys that never leave the client."""
        return set(self.init_state) - self.shared

    def assemble(self, model: SplitModel, shared: StateDict, local: StateDict) -> SplitModel:
        """Load into `model` every key: shared ones from `shared`, local ones from `local` (the initial model's
        values where the client has none yet)."""
        own = {k: local.get(k, self.init_state[k]) for k in self.local_keys()}
        load_partial(model, {**own, **{k: v for k, v in shared.items() if k in self.init_state}})
        return model

    def reply(self, model: nn.Module, stats: FitStats) -> Message:
        """A fit reply: the shared arrays of `model` plus the training scalars."""
        return Message(arrays=state_of(model, self.shared), scalars={"train_loss": stats.loss, "steps": stats.steps})
