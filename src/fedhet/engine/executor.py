"""The one interface between the round loop and a runtime: who trains and evaluates the clients."""

from __future__ import annotations

from typing import Any, Protocol

from fedhet.core.messages import Message, Reply


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

    def get_states(self) -> Any:
        """What a checkpoint stores of the clients (their states, or where to find them)."""

    def set_states(self, states: Any) -> None:
        """Restore what `get_states` returned (resume, rollback)."""
