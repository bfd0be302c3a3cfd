"""All: one model trained centrally on the union of all clients' training data (a privacy-violating oracle).

The runtime gives this method a single pseudo-client holding the pooled training data, and every client is
evaluated with that one model on its own test split. With `train.local_epochs` a round is that many epochs
over the pooled data; with `train.local_steps = T` a round is K·T mini-batches (K = number of clients), so
the oracle sees as many samples per round as the whole federation does.
"""

from __future__ import annotations

import dataclasses

from torch.utils.data import Dataset

from fedhet.algorithms.base import Algorithm, ClientContext, ClientState
from fedhet.algorithms.registry import register
from fedhet.config import TrainConfig
from fedhet.engine.local import TrainStats
from fedhet.engine.messages import Message
from fedhet.models import SplitModel


@register
class All(Algorithm):
    """Centralized oracle: FedAvg with one client that holds everyone's data."""

    name = "all"
    centralized = True

    def local_train(self, model: SplitModel, msg: Message, state: ClientState, ctx: ClientContext,
                    dataset: Dataset | None = None, train_cfg: TrainConfig | None = None) -> TrainStats:
        cfg = train_cfg or self.train_cfg
        if cfg.local_steps is not None:
            cfg = dataclasses.replace(cfg, local_steps=cfg.local_steps * int(ctx.extra.get("num_clients", 1)))
        return super().local_train(model, msg, state, ctx, dataset, cfg)
