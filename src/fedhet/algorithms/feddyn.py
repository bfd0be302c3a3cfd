"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, ICLR 2021): federated learning with dynamic
regularization.

Implements Algorithm 1. Client k, sampled in round t, receives theta^{t-1} and solves (Alg. 1, line 5)

    theta_k^t = argmin_theta  L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + (alpha/2) ||theta - theta^{t-1}||^2

then keeps the gradient state of its linear term (line 6; zero before the client first trains)

    grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1})

and the server keeps h (lines 9-10; h^0 = 0), with m the number of clients in the federation:

    h^t     = h^{t-1} - alpha (1/m) sum_{k in P_t} (theta_k^t - theta^{t-1})
    theta^t = mean_{k in P_t} theta_k^t - (1/alpha) h^t

Choices where the paper is silent or that this implementation makes:
- The state grad L_k (`FedDynClientState.grad`) and h (`FedDynServerState.h`) exist for the trainable floating-point
  parameters; buffers (BatchNorm running statistics, counters) are averaged as in FedAvg, without h.
- L_k is the client's mean cross-entropy; the local problem is solved by the configured local optimizer for
  `train.local_steps` / `train.local_epochs` (the paper's experiments: SGD for a fixed number of epochs).
- The mean over P_t follows `server.aggregation` (weighted by example counts by default, like every method here;
  `uniform` is the paper's plain mean). theta^t is set by line 10, so a server optimizer other than plain
  averaging (server.optimizer sgd, lr 1, momentum 0) is refused.
- m is the federation's size as the round loop knows it (`RoundInfo.num_clients`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.registry import register
from fedhet.core.aggregation import average, client_weights
from fedhet.core.contract import ClientContext, ClientState, FitStats, RoundInfo, ServerState, Work
from fedhet.core.messages import Message, Reply
from fedhet.core.params import StateDict
from fedhet.errors import ConfigError
from fedhet.losses.classification import cross_entropy


@dataclass(kw_only=True)
class FedDynServerState(ServerState):
    """The global model theta and the server state h (one tensor per trainable parameter)."""

    h: StateDict = field(default_factory=dict)


@dataclass(kw_only=True)
class FedDynClientState(ClientState):
    """The gradient state grad L_k(theta_k^{t-1}) of the linear term (empty: zero, before the first fit)."""

    grad: StateDict = field(default_factory=dict)


@dataclass(kw_only=True)
class FedDynWork(Work):
    """The fit's model, the received theta^{t-1} and the client's grad L_k(theta_k^{t-1}), by parameter name."""

    anchor: dict[str, torch.Tensor]
    grad: dict[str, torch.Tensor]


@dataclass
class FedDynParams:
    """alpha: weight of the dynamic regularizer (> 0; the paper searches 0.1, 0.01, 0.001)."""

    alpha: float = 0.01

    def validate(self) -> None:
        if not self.alpha > 0:
            raise ConfigError(f"feddyn: alpha must be > 0, got {self.alpha}")


@register
class FedDyn(Algorithm[FedDynServerState, FedDynClientState, FedDynWork, FedDynParams]):
    """FedAvg with a dynamic linear + quadratic regularizer per client and the server's correction h."""

    name = "feddyn"
    server_state_type, client_state_type, work_type = FedDynServerState, FedDynClientState, FedDynWork
    Params = FedDynParams
    # mean cross-entropy plus terms of the weights alone; alpha is read in `loss`, `finish` and `aggregate` only
    capabilities = Capabilities(call_params=frozenset({"alpha"}), loss_is_batch_mean=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: forwarded to Algorithm.__init__
        super().__init__(*args, **kwargs)
        if not self.server_opt.is_identity():
            raise ConfigError("feddyn sets the global model itself (Acar et al. 2021, Alg. 1, line 10); leave "
                              "server.optimizer=sgd, server.lr=1, server.momentum=0, server.lr_decay=1")
        self.dynamic = self.parts.trainable

    def zeros(self) -> StateDict:
        return self.parts.zeros(self.dynamic)

    def init_server(self) -> FedDynServerState:
        """theta^0 = the initial model, h^0 = 0."""
        return dataclasses.replace(super().init_server(), h=self.zeros())

    def aggregate(self, server: FedDynServerState, replies: list[Reply], info: RoundInfo) -> FedDynServerState:
        """h^t = h^{t-1} - alpha/m sum_k (theta_k - theta^{t-1});  theta^t = mean_k theta_k - h^t / alpha."""
        alpha, theta = self.params.alpha, server.model
        weights = client_weights([r.num_examples for r in replies], self.server_cfg.aggregation)
        mean = average([{k: r.message.arrays[k] for k in theta} for r in replies], weights)
        drift = average([{k: r.message.arrays[k] - theta[k] for k in self.dynamic} for r in replies],
                        [1.0] * len(replies))  # the plain mean over P_t, times |P_t| below: the sum
        m = max(info.num_clients, len(replies))
        h = {k: server.h[k] - alpha * len(replies) / m * drift[k] for k in self.dynamic}
        model = {**mean, **{k: mean[k] - h[k] / alpha for k in self.dynamic}}
        return dataclasses.replace(server, model=model, h=h)

    def start(self, msg: Message, state: FedDynClientState, ctx: ClientContext) -> FedDynWork:
        """The received model, a frozen copy of theta^{t-1} and the client's gradient state."""
        model = self.client_model(msg, state)
        params = dict(model.named_parameters())
        anchor = {k: params[k].detach().clone() for k in self.dynamic}
        grad = {k: v.to(ctx.device) for k, v in (state.grad or self.zeros()).items()}
        return FedDynWork(msg=msg, ctx=ctx, model=model, anchor=anchor, grad=grad)

    def loss(self, work: FedDynWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + (alpha/2) ||theta - theta^{t-1}||^2 (Alg. 1, line 5)."""
        params = [(p, work.grad[k], work.anchor[k]) for k, p in work.model.named_parameters() if k in work.grad]
        linear = torch.stack([(g * p).sum() for p, g, _ in params]).sum()
        prox = torch.stack([(p - a).pow(2).sum() for p, _, a in params]).sum()
        return cross_entropy(work.model, x, y) - linear + 0.5 * self.params.alpha * prox

    def finish(self, work: FedDynWork, state: FedDynClientState, stats: FitStats
               ) -> tuple[Message, FedDynClientState]:
        """Reply theta_k^t; keep grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1})."""
        reply, new_state = super().finish(work, state, stats)
        params = dict(work.model.named_parameters())
        grad = {k: (work.grad[k] - self.params.alpha * (params[k].detach() - work.anchor[k]))
                for k in self.dynamic}
        return reply, dataclasses.replace(new_state, grad=grad)
