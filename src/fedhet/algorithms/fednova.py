"""FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): normalized averaging, so that clients taking different
numbers of local steps do not bias the global model towards the clients that take more.

Implements the FedNova update of Sec. 4 (eqs. 6-7) with local (momentum) SGD. Client i takes tau_i local steps
from x^t to y_i; its update Delta_i = y_i - x^t is normalized by ||a_i||_1, the sum of the weights its local
solver puts on its gradients:

    d_i     = Delta_i / ||a_i||_1,    ||a_i||_1 = tau_i  (plain SGD)
                                      ||a_i||_1 = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)  (momentum rho)
    tau_eff = sum_i p_i ||a_i||_1
    x^{t+1} = x^t + tau_eff sum_i p_i d_i

with p_i the clients' weights (their share of the round's examples). With equal tau_i this is FedAvg.

Choices where the paper is silent or that this implementation makes:
- The client side is FedAvg's; a client adds ||a_i||_1 of the steps it actually took (`a_norm`, from its own
  `train.momentum`) to its reply, so clients with different step counts (`train.local_epochs` over different data
  sizes) or different momentum are normalized each by its own.
- Only trainable floating-point parameters are normalized; buffers (BatchNorm running statistics, counters) are
  averaged as in FedAvg. A client that took no step has d_i = 0.
- p_i follows `server.aggregation` (weighted by example counts by default: the paper's p_i; `uniform`).
- x^t + tau_eff sum_i p_i d_i is handed to the server optimizer as the average (plain by default; server
  momentum is the paper's FedNova with server momentum, Sec. 5).
- The normalization assumes SGD: `train.optimizer` other than sgd is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedhet.algorithms.base import ModelAlgorithm, NoParams
from fedhet.algorithms.registry import register
from fedhet.core.aggregation import average, client_weights
from fedhet.core.contract import ClientState, FitStats, RoundInfo, ServerState, Work
from fedhet.core.messages import Message, Reply
from fedhet.errors import ConfigError


def a_norm(steps: int, momentum: float) -> float:
    """||a_i||_1 of `steps` local SGD steps with heavy-ball momentum `momentum` (Wang et al. 2020, Sec. 4)."""
    if momentum == 0.0:
        return float(steps)
    return (steps - momentum * (1 - momentum ** steps) / (1 - momentum)) / (1 - momentum)


@register
class FedNova(ModelAlgorithm[NoParams]):
    """FedAvg whose server averages each client's update normalized by its number of local steps."""

    name = "fednova"
    Params = NoParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: forwarded to Algorithm.__init__
        super().__init__(*args, **kwargs)
        if self.train_cfg.optimizer != "sgd":
            raise ConfigError("fednova normalizes by the steps of local SGD (Wang et al. 2020, Sec. 4); set "
                              "train.optimizer=sgd")
        self.normalized = [k for k in self.parts.trainable if k in self.parts.shared]

    def finish(self, work: Work, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        """FedAvg's reply plus `a_norm` = ||a_i||_1 of the steps taken."""
        reply, new_state = super().finish(work, state, stats)
        scalars = {**reply.scalars, "a_norm": a_norm(stats.steps, self.train_cfg.momentum)}
        return Message(arrays=reply.arrays, scalars=scalars), new_state

    def aggregate(self, server: ServerState, replies: list[Reply], info: RoundInfo) -> ServerState:
        """x^t + tau_eff sum_i p_i Delta_i / ||a_i||_1 for the parameters, the plain average for the buffers."""
        x = server.model
        weights = client_weights([r.num_examples for r in replies], self.server_cfg.aggregation)
        p = [w / sum(weights) for w in weights]
        norms = [float(r.message.scalars["a_norm"]) for r in replies]
        tau_eff = sum(pi * a for pi, a in zip(p, norms, strict=True))
        d = average([{k: (r.message.arrays[k] - x[k]) / a if a > 0 else 0 * x[k] for k in self.normalized}
                     for r, a in zip(replies, norms, strict=True)], p)
        target = average([{k: r.message.arrays[k] for k in x} for r in replies], weights)
        target.update({k: x[k] + tau_eff * d[k] for k in self.normalized})
        model, opt = self.server_opt.step(x, target, server.opt)
        return dataclasses.replace(server, model=model, opt=opt)
