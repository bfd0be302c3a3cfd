"""What the algorithm contract needs of the layers below it, as structural types, so that importing
`fedhet.core.contract` loads neither the data layer nor the model zoo.

`ClientSplits` is a client's data as algorithms and the engine read it through `ClientContext.data`;
`fedhet.data.ClientData` satisfies it (mypy checks the engine's `ClientContext(data=...)` calls).
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Protocol

from torch.utils.data import Dataset

SampleSet = Dataset[Any]  # Any: a torch Dataset's items, (x, y) pairs whose x varies by modality (images, tokens, ...)


def num_samples(data: SampleSet | None) -> int:
    """How many samples `data` holds (None: 0). torch's `Dataset` type declares no `__len__`; every fedhet split
    is a map-style dataset that has one, which this checks."""
    if data is None:
        return 0
    if not isinstance(data, Sized):
        raise TypeError(f"{type(data).__name__} is a dataset without a length; fedhet needs map-style datasets")
    return len(data)


class ClientSplits(Protocol):
    """One client's splits: `train` with train-time augmentation; `val`, `test` and `train_eval` (the training
    samples) with the eval transform; `classes`: the class ids its head may predict (None: all of them)."""

    @property
    def name(self) -> str: ...

    @property
    def domain(self) -> str: ...

    @property
    def train(self) -> SampleSet: ...

    @property
    def val(self) -> SampleSet | None: ...

    @property
    def test(self) -> SampleSet: ...

    @property
    def train_eval(self) -> SampleSet: ...

    @property
    def classes(self) -> tuple[int, ...] | None: ...

    @property
    def num_train(self) -> int: ...
