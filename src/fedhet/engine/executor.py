"""The one interface between the round loop and a runtime: who trains and evaluates the clients."""

from __future__ import annotations

from typing import Any, Protocol

from fedhet.core.messages import Message, Reply
from fedhet.errors import FedhetError
from fedhet.yaml_input import JSONDict

ClientStates = Any  # Any: each runtime's own (states by client id, or where to find them)


class ClientsFailed(FedhetError):
    """Too few clients answered a round validly; the loop returns to the last completed round, writes its
    checkpoint and stops (a runtime whose clients can fail raises a subclass)."""


class ClientExecutor(Protocol):
    """Runs the clients' side of a round: the in-process runtime (sequential), the batched runtime (vectorized
    local training) and the Flower runtime (clients on Flower nodes) implement it; `RoundLoop` owns everything
    else (sampling, aggregation, commit, rollback, checkpoints, the run directory)."""

    @property
    def num_train_clients(self) -> int:
        """How many clients can be sampled for training."""

    def fit(self, rnd: int, messages: dict[int, Message]) -> list[Reply]:
        """Local training of the clients in `messages` (in that order); new states replace old ones only at
        the end, so a failure leaves the committed states as they were."""

    def evaluate(self, rnd: int, messages: dict[int, Message], split: str) -> dict[str, dict[str, float]]:
        """Metrics of each client's deployed model on its own split, keyed by client name."""

    def get_states(self) -> ClientStates:
        """What a checkpoint stores of the clients (their states, or where to find them)."""

    def set_states(self, states: ClientStates) -> None:
        """Restore what `get_states` returned (resume, rollback)."""

    def begin_round(self, rnd: int) -> None:
        """Round `rnd` starts (before sampling)."""

    def on_disk(self) -> None:
        """The states as they are now are the ones on disk (a checkpoint was written or resumed)."""

    def checkpoint_config(self, config: JSONDict) -> JSONDict:
        """The config a checkpoint of this runtime is fingerprinted with."""
