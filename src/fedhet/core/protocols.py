"""What the algorithm contract needs of the layers below it, as structural types, so that importing
`fedhet.core.contract` loads neither the data layer nor the model zoo.

`ClientSplits` is a client's data as algorithms and the engine read it through `ClientContext.data`;
`fedhet.data.ClientData` satisfies it (mypy checks the engine's `ClientContext(data=...)` calls).
"""

from __future__ import annotations

from typing import Any, Protocol

from torch.utils.data import Dataset


class ClientSplits(Protocol):
    """One client's splits: `train` with train-time augmentation; `val`, `test` and `train_eval` (the training
    samples) with the eval transform; `classes`: the class ids its head may predict (None: all of them)."""

    @property
    def name(self) -> str: ...

    @property
    def domain(self) -> str: ...

    @property
    def train(self) -> Dataset[Any]: ...  # Any: torch Dataset items, (x, y) pairs

    @property
    def val(self) -> Dataset[Any] | None: ...  # Any: torch Dataset items, (x, y) pairs

    @property
    def test(self) -> Dataset[Any]: ...  # Any: torch Dataset items, (x, y) pairs

    @property
    def train_eval(self) -> Dataset[Any]: ...  # Any: torch Dataset items, (x, y) pairs

    @property
    def classes(self) -> tuple[int, ...] | None: ...

    @property
    def num_train(self) -> int: ...
