"""FedAvg (McMahan et al., AISTATS 2017): local SGD, then the server averages all weights.

With `server.optimizer`/`server.lr`/`server.momentum` this is also FedAvgM and FedAdam (Reddi et al. 2021).
"""

from __future__ import annotations

from fedhet.algorithms.base import ModelAlgorithm, NoParams
from fedhet.algorithms.registry import register


@register
class FedAvg(ModelAlgorithm[NoParams]):
    """Every parameter and buffer is shared; the base class implements the whole method."""

    name = "fedavg"
    Params = NoParams
