"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020): FedAvg with a proximal local objective.

Implements the local problem of Algorithm 2 (FedProx), eq. (2):

    min_w  h_k(w; w^t) = F_k(w) + (mu / 2) * ||w - w^t||^2

with F_k the client's cross-entropy and w^t the global model the client received at the start of the round
(a frozen copy, taken after the message is loaded into the working model). Server side is FedAvg.

Choices where the paper is silent or that this implementation makes:
- The proximal term runs over every *trainable* parameter (requires_grad); buffers (e.g. BatchNorm running
  statistics) are not penalised. For FedProx every key is shared, so the anchor equals the received global model.
- The paper's "inexact" local solver (a gamma-inexact minimiser, variable work per device) is realised as the
  configured number of local SGD steps / epochs (`train.local_steps` / `train.local_epochs`), as in the
  authors' experiments with a fixed number of epochs; straggler dropping is not modelled.
- The reported `train_loss` is the mean of the full local objective (CE + proximal term).
- mu = 0 reduces exactly to FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientContext, ClientState, ServerState, Work
from fedhet.core.messages import Message
from fedhet.errors import ConfigError
from fedhet.losses.classification import cross_entropy


def proximal_term(params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum_i ||p_i - a_i||^2 over paired tensors (the squared distance of two parameter lists)."""
    if not params:
        return torch.zeros(())
    return torch.stack([(p - a).pow(2).sum() for p, a in zip(params, anchor, strict=True)]).sum()


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters that local training updates (requires_grad), in a stable order."""
    return [p for p in model.parameters() if p.requires_grad]


@dataclass(kw_only=True)
class ProxWork(Work):
    """The fit's model, the frozen round-start copy of its trainable parameters w^t, and mu as a 0-dim tensor
    (so that the batched runtime can give every lane its own mu: `capabilities.lane_params`)."""

    anchor: tuple[torch.Tensor, ...] = field(default=())
    mu: torch.Tensor = field(default_factory=lambda: torch.zeros(()))


@dataclass
class FedProxParams:
    """mu: weight of the proximal term (mu/2)||w - w_global||^2 (>= 0; 0 is FedAvg)."""

    mu: float = 0.01

    def validate(self) -> None:
        if not self.mu >= 0:
            raise ConfigError(f"fedprox: mu must be >= 0, got {self.mu}")


@register
class FedProx(Algorithm[ServerState, ClientState, ProxWork, FedProxParams]):
    """FedAvg whose local loss adds (mu/2)||w - w_global||^2 over the trainable parameters."""

    name = "fedprox"
    server_state_type = ServerState
    client_state_type = ClientState
    work_type = ProxWork
    # mu: read in `start` only, and it reaches the loss through the Work, so lanes may differ in it; the loss is a
    # mean cross-entropy plus a term of the weights alone
    capabilities = Capabilities(call_params=frozenset({"mu"}), lane_params=frozenset({"mu"}), loss_is_batch_mean=True)
    Params = FedProxParams

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> ProxWork:
        """The received model and a frozen copy of its trainable parameters as the anchor."""
        model = self.client_model(msg, state)
        anchor = tuple(p.detach().clone() for p in trainable(model))
        mu = torch.tensor(self.params.mu, dtype=torch.float32, device=anchor[0].device if anchor else None)
        return ProxWork(msg=msg, ctx=ctx, model=model, anchor=anchor, mu=mu)

    def loss(self, work: ProxWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy plus (mu/2)||w - w_global||^2 (mu = 0 adds exact zeros: no branch on a per-lane value)."""
        ce = cross_entropy(work.model, x, y)
        if not work.anchor:
            return ce
        return ce + 0.5 * work.mu * proximal_term(trainable(work.model), work.anchor)
