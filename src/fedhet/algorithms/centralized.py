"""All: one model trained centrally on the union of all clients' training data (a privacy-violating oracle).

The runtime gives this method a single pseudo-client holding the pooled training data, and every client is
evaluated with that one model on its own test split. With `train.local_epochs` a round is that many epochs
over the pooled data; with `train.local_steps = T` a round is K·T mini-batches (K = `ctx.num_clients`, the
federation's number of clients), so the oracle sees as many samples per round as the whole federation does.
"""

from __future__ import annotations

import dataclasses

from fedhet.algorithms.base import ModelAlgorithm, NoParams
from fedhet.algorithms.registry import register
from fedhet.core.contract import LocalPass, Work, loss_pass


@register
class All(ModelAlgorithm[NoParams]):
    """Centralized oracle: FedAvg with one client that holds everyone's data."""

    name = "all"
    Params = NoParams
    centralized = True

    def passes(self, work: Work) -> list[LocalPass]:
        """FedAvg's pass over the pooled data; `local_steps` scaled by the number of clients."""
        cfg = self.train_cfg
        if cfg.local_steps is not None:
            cfg = dataclasses.replace(cfg, local_steps=cfg.local_steps * work.ctx.num_clients)
        return [loss_pass(work.model, lambda x, y: self.loss(work, x, y), cfg)]
