"""The server's hypernetwork update by the vector-Jacobian product with each client's Delta P_i (spec §2.2).

For each client i of the round, `torch.autograd.grad(P_i, [phi, z_i], grad_outputs=Delta_i)` gives
(dP_i/dphi)^T Delta_i and (dP_i/dz_i)^T Delta_i (Eqs. (8)-(9)); then SGD steps phi and z_i (Eqs. (10)-(11)).

* `sign="pfedhn"` (default; pFedHN, FedTP): Delta_i = P_init - P_final. The step is then gradient descent on
  0.5 ||h(phi; z_i) - P_final||^2: the generated P moves toward the locally trained one. `sign="paper"`:
  Delta_i = P_final - P_init as Algorithm 1 prints it (spec §8), which moves it away.
* `weighting`: "sample_fraction" (Eq. (8), FedTP) weights client i by m_i / sum_j m_j over the round's
  clients; "uniform" by 1/|C|. `weight_embedding=False` steps z_i by its unweighted VJP, as Algorithm 1's
  z-line prints it; True (default) weights it like phi's, as Eq. (9) and FedTP do.
* `aggregation`: "sum" (FedTP) adds the weighted VJPs and takes one step per round; "sequential" takes one
  step per client in the given order with weight |C| w_i (so 1 under "uniform": pFedHN's one step per client).
  Every VJP is taken at the phi that generated the round's P_i, so pass all of a round's clients to one `step`.
* `embedding_update`: "row" (default, our choice) keeps z out of the torch optimizer and steps only the rows of
  the round's clients, with the same SGD rule (momentum, weight decay) per row: z_j of an absent client never
  moves. "dense" puts the whole table in the optimizer as FedTP / pFedHN do, so absent rows still decay and
  coast on momentum.
* Defaults lr 0.01, momentum 0.9, weight decay 1e-3 (FedTP's hypernetwork SGD; beta = 0.01, spec §2.10), tuned
  for `schedule_rounds` = 1500 rounds (FedTP main.py:37, 41; the paper's 1500). A run of R rounds steps with
  `lr_for(R)` = lr * sqrt(schedule_rounds / R) (`scaled_lr`): SGD's step for a horizon of T steps is
  D / (G sqrt(T)) (the minimax constant step for convex Lipschitz objectives), so the step tuned for T_0 becomes
  lr sqrt(T_0 / T) for T; 1500 rounds keep 0.01, 60 rounds give 0.05. `schedule_rounds=None`: lr as given;
  `max_grad_norm` (pFedHN clips at 50; FedTP and the paper do not) is off by default. It clips phi's gradient
  by its joint norm and each z_i row by its own, so that no other client's Delta scales z_i's step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedhet.errors import ConfigError, TrainingDivergedError, unknown_choice
from fedhet.models.hypernet import HyperNetwork, HyperNetworkError

SIGNS = ("pfedhn", "paper")
WEIGHTINGS = ("sample_fraction", "uniform")
AGGREGATIONS = ("sum", "sequential")
EMBEDDING_UPDATES = ("row", "dense")


@dataclass(frozen=True)
class HyperUpdateConfig:
    """The switches of the update (module docstring); bad values raise ConfigError."""

    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-3
    sign: str = "pfedhn"
    weighting: str = "sample_fraction"
    weight_embedding: bool = True
    aggregation: str = "sum"
    embedding_update: str = "row"
    max_grad_norm: float | None = None
    schedule_rounds: int | None = 1500  # the rounds `lr` is tuned for (FedTP's); None: lr as given

    def __post_init__(self) -> None:
        for kind, value, choices in (("hypernetwork sign", self.sign, SIGNS),
                                     ("hypernetwork weighting", self.weighting, WEIGHTINGS),
                                     ("hypernetwork aggregation", self.aggregation, AGGREGATIONS),
                                     ("hypernetwork embedding_update", self.embedding_update, EMBEDDING_UPDATES)):
            if value not in choices:
                raise unknown_choice(kind, str(value), choices)
        if not self.lr > 0 or not 0 <= self.momentum < 1 or not self.weight_decay >= 0:
            raise ConfigError(f"hypernetwork update: need lr > 0, 0 <= momentum < 1, weight_decay >= 0; got lr="
                              f"{self.lr}, momentum={self.momentum}, weight_decay={self.weight_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError(f"hypernetwork update: max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        r = self.schedule_rounds
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise ConfigError(f"method_args.update.schedule_rounds must be an integer >= 1 or null, got {r!r}")

    def lr_for(self, rounds: int) -> float:
        """The step for a run of `rounds` rounds: `scaled_lr(lr, schedule_rounds, rounds)` (module docstring)."""
        return self.lr if self.schedule_rounds is None else scaled_lr(self.lr, self.schedule_rounds, rounds)


def scaled_lr(lr: float, schedule_rounds: int, rounds: int) -> float:
    """lr * sqrt(schedule_rounds / rounds): SGD's horizon rule eta ~ 1/sqrt(T) (module docstring)."""
    if rounds < 1:
        raise ValueError(f"scaled_lr: rounds must be >= 1, got {rounds}")
    return lr * math.sqrt(schedule_rounds / rounds)


@dataclass(frozen=True)
class ClientUpdate:
    """What client i returns: `change` = P_final - P_init (Algorithm 1's printed Delta P_i) and m_i.

    `sent` (optional) is the P_i the server sent; `step` then checks that phi has not moved since.
    """

    client_id: int
    num_samples: int
    change: Mapping[str, Tensor]
    sent: Mapping[str, Tensor] | None = None

    @classmethod
    def from_params(cls, client_id: int, num_samples: int, sent: Mapping[str, Tensor],
                    returned: Mapping[str, Tensor]) -> ClientUpdate:
        """The update from the P_i sent and the P_i' the client returned after local training."""
        if set(sent) != set(returned):
            raise HyperNetworkError(f"client {client_id} returned tensors {sorted(returned)}; sent {sorted(sent)}")
        change = {name: returned[name].detach() - sent[name].detach() for name in sent}
        return cls(client_id, num_samples, change, {name: t.detach() for name, t in sent.items()})


def vjp_direction(change: Mapping[str, Tensor], sign: str) -> dict[str, Tensor]:
    """Delta_i given to the VJP: P_init - P_final = -change ("pfedhn") or P_final - P_init = change ("paper")."""
    if sign not in SIGNS:
        raise unknown_choice("hypernetwork sign", sign, SIGNS)
    return {name: -t if sign == "pfedhn" else t for name, t in change.items()}


class HyperNetworkUpdater:
    """Steps phi and the z_i of a HyperNetwork from a round's client updates (Eqs. (8)-(11))."""

    def __init__(self, hnet: HyperNetwork, config: HyperUpdateConfig | None = None) -> None:
        self.hnet, self.config = hnet, config or HyperUpdateConfig()
        table = hnet.embeddings.weight
        params = hnet.phi_parameters() + ([table] if self.config.embedding_update == "dense" else [])
        self.optimizer = torch.optim.SGD(params, lr=self.config.lr, momentum=self.config.momentum,
                                         weight_decay=self.config.weight_decay)
        self.z_momentum = torch.zeros_like(table.detach())
        self.z_started = torch.zeros(hnet.num_clients, dtype=torch.bool)

    def client_gradients(self, update: ClientUpdate) -> tuple[list[Tensor], Tensor]:
        """Unweighted (dP_i/dphi)^T Delta_i (one tensor per `phi_parameters()`) and (dP_i/dz_i)^T Delta_i."""
        i = self._check(update)
        generated = self.hnet(i)
        if update.sent is not None and any(not torch.allclose(generated[n].detach(), update.sent[n].to(
                generated[n].dtype), rtol=1e-5, atol=1e-6) for n in generated):
            raise HyperNetworkError(f"the P_i sent to client {i} is no longer h(phi; z_i): the hypernetwork moved "
                                    "since it was sent; pass all of a round's clients to one step() call")
        delta = vjp_direction(update.change, self.config.sign)
        names, phi = list(generated), self.hnet.phi_parameters()
        grads = torch.autograd.grad([generated[n] for n in names], [*phi, self.hnet.embeddings.weight],
                                    grad_outputs=[delta[n].to(generated[n].dtype) for n in names],
                                    allow_unused=True)
        phi_grads = [torch.zeros_like(p) if g is None else g for p, g in zip(phi, grads[:-1], strict=True)]
        table_grad = grads[-1]
        z_grad = torch.zeros_like(self.z_momentum[i]) if table_grad is None else table_grad[i]
        return phi_grads, z_grad

    def client_weights(self, updates: Sequence[ClientUpdate]) -> list[float]:
        """w_i = m_i / sum_j m_j ("sample_fraction", Eq. (8)) or 1/|C| ("uniform") over the round's clients."""
        if self.config.weighting == "uniform":
            return [1.0 / len(updates)] * len(updates)
        total = sum(u.num_samples for u in updates)
        return [u.num_samples / total for u in updates]

    def step(self, updates: Sequence[ClientUpdate]) -> None:
        """One round's update of phi and of each participating z_i (Algorithm 1's last two lines)."""
        ids = [u.client_id for u in updates]
        if not updates or len(set(ids)) != len(ids):
            raise HyperNetworkError(f"step needs each participating client once; got client ids {ids}")
        for update in updates:
            self._check(update)
        weights = self.client_weights(updates)
        grads = [self.client_gradients(u) for u in updates]
        scale = 1 if self.config.aggregation == "sum" else len(updates)
        z_rows = {u.client_id: (scale * w if self.config.weight_embedding else 1.0) * z
                  for u, w, (_, z) in zip(updates, weights, grads, strict=True)}
        if self.config.aggregation == "sum":
            phi = [sum((w * g[k] for w, (g, _) in zip(weights, grads, strict=True)), torch.zeros_like(g0))
                   for k, g0 in enumerate(grads[0][0])]
            self._apply(phi, z_rows)
            return
        for u, w, (g, _) in zip(updates, weights, grads, strict=True):
            self._apply([scale * w * x for x in g], {u.client_id: z_rows[u.client_id]})

    def _apply(self, phi_grads: list[Tensor], z_rows: dict[int, Tensor]) -> None:
        """Clip (phi jointly, each z row alone), then one SGD step on phi (+ the table if "dense") and the z rows."""
        if self.config.max_grad_norm is not None:
            phi_grads = _clipped(phi_grads, self.config.max_grad_norm)
            z_rows = {i: _clipped([z], self.config.max_grad_norm)[0] for i, z in z_rows.items()}
        self.optimizer.zero_grad(set_to_none=True)
        for p, g in zip(self.hnet.phi_parameters(), phi_grads, strict=True):
            p.grad = g.detach()
        table = self.hnet.embeddings.weight
        if self.config.embedding_update == "dense":
            table.grad = torch.zeros_like(table)
            for i, z in z_rows.items():
                table.grad[i] = z.detach()
        self.optimizer.step()
        if self.config.embedding_update == "row":
            self._row_step(z_rows)

    @torch.no_grad()
    def _row_step(self, z_rows: dict[int, Tensor]) -> None:
        """torch.optim.SGD's rule (dampening 0, no Nesterov) applied to the given rows of the table only."""
        table, cfg = self.hnet.embeddings.weight, self.config
        for i, grad in z_rows.items():
            d = grad + cfg.weight_decay * table[i] if cfg.weight_decay else grad.clone()
            if cfg.momentum:
                self.z_momentum[i] = cfg.momentum * self.z_momentum[i] + d if self.z_started[i] else d
                self.z_started[i] = True
                d = self.z_momentum[i]
            table[i] -= cfg.lr * d

    def _check(self, update: ClientUpdate) -> int:
        """The update's client id, after checking its tensors' names, shapes, finiteness and m_i."""
        i = self.hnet.check_client(update.client_id)
        shapes = self.hnet.shapes
        if set(update.change) != set(shapes):
            raise HyperNetworkError(f"client {i}'s Delta P is missing {sorted(set(shapes) - set(update.change))} "
                                    f"and has unknown {sorted(set(update.change) - set(shapes))}")
        for name, t in update.change.items():
            if tuple(t.shape) != shapes[name]:
                raise HyperNetworkError(f"client {i}'s Delta P['{name}'] has shape {tuple(t.shape)}; "
                                        f"expected {shapes[name]}")
            if not torch.isfinite(t).all():
                raise TrainingDivergedError(f"client {i}'s Delta P['{name}'] is not finite; lower the local lr")
        if isinstance(update.num_samples, bool) or not isinstance(update.num_samples, int) or update.num_samples < 1:
            raise HyperNetworkError(f"client {i}'s num_samples must be an integer >= 1, got {update.num_samples!r}")
        return i

    def state_dict(self) -> dict[str, Any]:  # Any: torch-saved state
        """The optimizer's and the per-row momentum state, for checkpoints (the hypernetwork's is its own)."""
        return {"optimizer": self.optimizer.state_dict(), "z_momentum": self.z_momentum.clone(),
                "z_started": self.z_started.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # Any: torch-saved state
        """Restore what `state_dict` returned."""
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the config's lr, not the saved one (it may be rescaled)
            group["lr"] = self.config.lr
        self.z_momentum.copy_(state["z_momentum"])
        self.z_started.copy_(state["z_started"])


def _clipped(grads: list[Tensor], max_norm: float) -> list[Tensor]:
    """`grads` scaled down to a joint L2 norm of at most `max_norm` (as torch.nn.utils.clip_grad_norm_)."""
    norm = float(torch.sqrt(sum(((g.double() ** 2).sum() for g in grads), torch.zeros((), dtype=torch.float64))))
    return [g * min(1.0, max_norm / (norm + 1e-6)) for g in grads]
