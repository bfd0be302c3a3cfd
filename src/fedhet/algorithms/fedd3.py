"""FedD3 (Song et al., 2023, "Federated learning via decentralized dataset distillation in resource-constrained
edge environments"), the one-shot baseline of FedBiP's Tables 1-2 ("distilled instances from the clients are
uploaded"; spec fedbip.md, baselines: Kernel Inducing Points, 1 image per class per domain).

Client, once: its training images (eval transform) are distilled into `per_class` instances per local class with
KIP (Nguyen et al., ICLR 2021): the support set X_s (labels Y_s one-hot, fixed) starts from randomly drawn real
images of each class and descends, on target batches (X_t, Y_t) of the real data (the pass "kip", Adam),
    L(X_s) = ‖Y_t − K_ts (K_ss + λ tr(K_ss)/n_s I)^{-1} Y_s‖² / |Y_t|                 (KIP's kernel ridge loss)
The reply is the distilled instances (flattened) and their labels; its scalars are the input shape (metadata).
Server: the run's model trains on the union of the uploads only (`server_epochs`, the `train` optimizer) and is
deployed to every client.

**Simplified** (no official code here): KIP's kernel is the NTK of an infinitely wide network; here it is an RBF
kernel on the flattened inputs, k(a, b) = exp(−‖a − b‖² / (2h²)), h² = the mean pairwise squared distance of the
client's real inputs (fixed before distilling). The labels are not learned.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from fedhet.algorithms.base import Algorithm, ArraySpec
from fedhet.algorithms.fedbip import load_split
from fedhet.algorithms.registry import register
from fedhet.algorithms.server_training import train_on_tensors
from fedhet.core.contract import (
    ClientContext,
    ClientState,
    FitStats,
    LocalPass,
    Optimizers,
    OptimSpec,
    RoundInfo,
    ServerState,
    Work,
)
from fedhet.core.messages import Message, Reply, Scalar
from fedhet.core.params import state_of
from fedhet.errors import ConfigError

SHAPE = ("dim0", "dim1", "dim2")  # reply scalars: the input shape (up to 3 dims; 0 = absent)


@dataclass
class FedD3Params:
    """KIP distillation (`per_class` instances per local class, `kip_epochs` passes of target batches of
    `kip_batch_size`, Adam `kip_lr`, ridge `ridge` relative to tr(K_ss)/n_s) and the server's `server_epochs`."""

    per_class: int = 1
    kip_epochs: int = 50
    kip_batch_size: int = 64
    kip_lr: float = 0.01
    ridge: float = 1e-3
    server_epochs: int = 300

    def validate(self) -> None:
        for name in ("per_class", "kip_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"fedd3 method_args.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("kip_epochs", "server_epochs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"fedd3 method_args.{name} must be >= 0, got {getattr(self, name)}")
        if not self.kip_lr > 0 or not self.ridge > 0:
            raise ConfigError(f"fedd3 method_args.kip_lr and ridge must be > 0, got {self.kip_lr} and {self.ridge}")


def rbf(a: Tensor, b: Tensor, h2: float) -> Tensor:
    """k(a, b) = exp(−‖a − b‖² / (2 h²)) between the rows of a (n, D) and b (m, D)."""
    return torch.exp(-torch.cdist(a, b).square() / (2 * h2))


def kip_loss(support: Tensor, y_support: Tensor, target: Tensor, y_target: Tensor, h2: float,
             ridge: float) -> Tensor:
    """KIP's loss: the kernel ridge regression of Y_t from the support set, mean squared error."""
    k_ss, k_ts = rbf(support, support, h2), rbf(target, support, h2)
    lam = ridge * torch.trace(k_ss) / len(support)
    eye = torch.eye(len(support), dtype=support.dtype, device=support.device)
    pred: Tensor = k_ts @ torch.linalg.solve(k_ss + lam * eye, y_support)
    return (pred - y_target).square().sum() / len(y_target)


def initial_support(x: Tensor, y: Tensor, per_class: int) -> tuple[Tensor, Tensor]:
    """`per_class` real inputs of every local class, drawn with torch's global RNG (seeded by the engine); a class
    with fewer inputs gives them all."""
    picks = [members[torch.randperm(len(members))[:per_class]] for c in sorted(set(y.tolist()))
             for members in [(y == c).nonzero().flatten()]]
    idx = torch.cat(picks)
    return x[idx].clone(), y[idx].clone()


@dataclass(kw_only=True)
class FedD3Server(ServerState):
    """`distilled`: the number of uploaded instances the model was trained on (0 until the server step)."""

    distilled: int = 0

    def facts(self) -> dict[str, Any]:  # Any: JSON facts
        return {"fedd3": {"distilled": self.distilled}} if self.distilled else {}


@dataclass(kw_only=True)
class FedD3Work(Work):
    """The support set being distilled, its labels, the kernel bandwidth and the input shape."""

    support: torch.nn.Parameter
    labels: Tensor
    real: TensorDataset
    h2: float
    shape: tuple[int, ...] = field(default_factory=tuple)


@register
class FedD3(Algorithm[FedD3Server, ClientState, FedD3Work, FedD3Params]):
    """One upload of KIP-distilled instances per client; the server trains on their union."""

    name = "fedd3"
    Params = FedD3Params
    one_shot = True
    server_state_type = FedD3Server
    client_state_type = ClientState
    work_type = FedD3Work

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> FedD3Work:
        """The client's real inputs (flattened), the initial support set and the RBF bandwidth."""
        x, y = load_split(ctx.data.train_eval)
        flat = x.flatten(1).float()
        h2 = max(float(torch.pdist(flat).square().mean()) / 2, 1e-8) if len(flat) > 1 else 1.0
        support, labels = initial_support(flat, y, self.params.per_class)
        real = TensorDataset(flat, torch.nn.functional.one_hot(y, self.num_classes).float())
        return FedD3Work(msg=msg, ctx=ctx, model=self.parts.spare("workspace"), support=torch.nn.Parameter(support),
                         labels=labels, real=real, h2=h2, shape=tuple(x.shape[1:]))

    def passes(self, work: FedD3Work) -> list[LocalPass]:
        """KIP (module doc) over target batches of the real data."""
        p = self.params
        if p.kip_epochs == 0:
            return []
        train = dataclasses.replace(self.train_cfg, batch_size=p.kip_batch_size, local_epochs=p.kip_epochs,
                                    local_steps=None)
        y_s = torch.nn.functional.one_hot(work.labels, self.num_classes).float()

        def step(x_t: Tensor, y_t: Tensor, optimizers: Optimizers) -> Tensor:
            loss = kip_loss(work.support, y_s, x_t, y_t, work.h2, p.ridge)
            optimizers.step(loss, "kip")
            return loss

        optim = OptimSpec(params=[work.support], kind="adam", lr=p.kip_lr, betas=(0.9, 0.999))
        return [LocalPass("kip", step, {"kip": optim}, train, data=work.real)]

    def finish(self, work: FedD3Work, state: ClientState, stats: FitStats) -> tuple[Message, ClientState]:
        """The one upload: the distilled instances and their labels; scalars: the input shape. Nothing kept."""
        dims = list(work.shape) + [0] * (len(SHAPE) - len(work.shape))
        scalars: dict[str, Scalar] = {"steps": stats.steps, **dict(zip(SHAPE, dims, strict=True))}
        return Message(arrays={"images": work.support.detach().float().clone(), "labels": work.labels.long()},
                       scalars=scalars), state

    def reply_layout(self, broadcast: Message) -> dict[str, ArraySpec]:
        """Instances (-1, D) flattened and labels (-1,): -1 is the client's number of instances / input size."""
        return {"images": ((-1, -1), torch.float32), "labels": ((-1,), torch.int64)}

    def broadcast(self, server: FedD3Server, info: RoundInfo, client_id: int) -> Message:
        """Before the server step only the request; after it the trained model, which every client deploys."""
        if info.round != 1:
            raise ConfigError(f"fedd3 is one-shot: it runs round 1 only, not round {info.round} (set rounds=1)")
        return Message(arrays=server.model) if server.distilled else Message(scalars={"one_shot": True})

    def aggregate(self, server: FedD3Server, replies: list[Reply], info: RoundInfo) -> FedD3Server:
        """The model trained on the union of the distilled instances only."""
        if not replies:
            return server
        shapes = {tuple(int(r.message.scalars[k]) for k in SHAPE) for r in replies}
        if len(shapes) > 1:
            raise ConfigError(f"fedd3 clients sent inputs of different shapes {sorted(shapes)}; set data.image_size")
        shape = tuple(d for d in shapes.pop() if d)
        x = torch.cat([r.message.arrays["images"] for r in replies]).view(-1, *shape)
        y = torch.cat([r.message.arrays["labels"] for r in replies])
        if x.shape[1:].numel() != math.prod(shape):
            raise ConfigError("fedd3: an upload's instances do not match its input shape")
        model = self.server_model(server)
        train_on_tensors(model, x, y, self.params.server_epochs, self.train_cfg, self.train_cfg.lr, self.device,
                         what="FedD3 server training on the distilled instances")
        return dataclasses.replace(server, model=state_of(model, self.parts.shared), distilled=len(y))
