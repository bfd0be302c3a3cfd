"""BatchNorm for the batched runtime: torch's BatchNorm kernel, with the running statistics returned.

torch's BatchNorm updates its running buffers in place; under `functional_call` + `vmap` + `grad` those writes
would go to per-call tensors that the caller never sees. `FunctionalBatchNorm` normalises with torch's own
`F.batch_norm` kernel (so the output and its gradient are bit-exact with in-process training) and writes the
new (detached) running statistics into a collector that the client step returns as an output: the per-client
BN state is an explicit input and output of the step, with no in-place buffer update. The update is torch's
(Ioffe & Szegedy 2015; r <- (1 - momentum) r + momentum * stat with the unbiased batch variance, or the
cumulative average 1 / num_batches_tracked when momentum is None). The collector reaches the layers through
`BatchNormContext`, set for one forward call. In eval mode the layer normalises with its running statistics
(or with batch statistics when it does not track them), like torch. Lanes are never padded (lanes.py groups
them by batch size), so the statistics are always over a lane's real samples.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from fedhet.errors import LanesRefused


@dataclass
class BatchNormContext:
    """Where the BatchNorm layers put their new running statistics during one forward call."""

    updates: dict[str, torch.Tensor] = field(default_factory=dict)


class FunctionalBatchNorm(nn.Module):
    """A drop-in for BatchNorm1d/2d/3d (same parameters, buffers and state-dict keys) whose running-stat updates
    are returned, not written in place (see the module docstring)."""

    # Registered only when the wrapped layer has them (affine; track_running_stats), as in torch.
    weight: nn.Parameter
    bias: nn.Parameter
    running_mean: torch.Tensor
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, name: str) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = bn.num_features, bn.eps, bn.momentum
        self.affine, self.track_running_stats = bn.affine, bn.track_running_stats
        self.name = name  # prefix of this layer's keys in the model's state dict
        self.context: BatchNormContext | None = None
        if bn.affine:
            self.weight = nn.Parameter(bn.weight.detach().clone(), requires_grad=bn.weight.requires_grad)
            self.bias = nn.Parameter(bn.bias.detach().clone(), requires_grad=bn.bias.requires_grad)
        for key in ("running_mean", "running_var", "num_batches_tracked"):
            value = getattr(bn, key, None)
            if value is not None:
                self.register_buffer(key, value.detach().clone())

    def _shape(self, x: torch.Tensor) -> list[int]:
        return [1, -1] + [1] * (x.dim() - 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = self._shape(x)
        ctx = self.context
        use_batch = self.training or not self.track_running_stats
        if use_batch:
            if ctx is None:
                raise RuntimeError("FunctionalBatchNorm needs a BatchNormContext (see step.py)")
            y = nn.functional.batch_norm(x, None, None, self.weight if self.affine else None,
                                         self.bias if self.affine else None, True, 0.0, self.eps)
            if self.training and self.track_running_stats:
                dims = [0] + list(range(2, x.dim()))
                n = x.numel() // x.shape[1]
                with torch.no_grad():
                    var, mean = torch.var_mean(x.detach(), dims, correction=0)
                self._record(ctx, mean, var * (n / max(n - 1, 1)))
            return y
        y = (x - self.running_mean.reshape(shape)) / torch.sqrt(self.running_var + self.eps).reshape(shape)
        if self.affine:
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y

    def _record(self, ctx: BatchNormContext, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        """Put the updated running statistics into the context (torch's update rule, not in place). A layer that
        runs twice in one call updates from its first update, as torch's in-place writes would."""
        names = ("running_mean", "running_var", "num_batches_tracked")
        keys = [f"{self.name}{n}" for n in names]
        old_mean, old_var, old_count = (ctx.updates.get(k, getattr(self, n)) for k, n in zip(keys, names, strict=True))
        count = old_count + 1
        if self.momentum is None:
            factor = (1.0 / count.to(mean.dtype))
        else:
            factor = torch.full((), self.momentum, dtype=mean.dtype, device=mean.device)
        ctx.updates[keys[0]] = old_mean * (1 - factor) + mean * factor
        ctx.updates[keys[1]] = old_var * (1 - factor) + unbiased_var * factor
        ctx.updates[keys[2]] = count


STATEFUL_OK = (nn.modules.batchnorm._BatchNorm,)


def convert(model: nn.Module) -> tuple[nn.Module, list[FunctionalBatchNorm]]:
    """A deep copy of `model` whose BatchNorm layers are `FunctionalBatchNorm`s (same keys and values).

    Raises LanesRefused (a ConfigError) for layers the batched step cannot reproduce: train-mode dropout (it draws from
    torch's global RNG between mini-batches, which in-process training interleaves with data shuffling) and
    layers other than BatchNorm that keep buffers (their updates would be lost).
    """
    model = copy.deepcopy(model)
    layers: list[FunctionalBatchNorm] = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            raise LanesRefused(f"layer '{name}' is dropout with p={module.p}: its random masks cannot be reproduced "
                              "by run.runtime=batched; set the model's dropout to 0 or use run.runtime=inprocess")
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            if isinstance(module, nn.SyncBatchNorm):
                raise LanesRefused(f"layer '{name}' is SyncBatchNorm; run.runtime=batched supports BatchNorm1d/2d/3d")
            new = FunctionalBatchNorm(module, f"{name}." if name else "")
            _set_submodule(model, name, new)
            layers.append(new)
        elif not isinstance(module, STATEFUL_OK) and any(True for _ in module.buffers(recurse=False)):
            raise LanesRefused(f"layer '{name}' ({type(module).__name__}) keeps buffers that run.runtime=batched "
                              "does not update; use run.runtime=inprocess")
    return model, layers


def _set_submodule(root: nn.Module, dotted: str, new: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


@contextmanager
def batch_norm_context(layers: list[FunctionalBatchNorm], ctx: BatchNormContext) -> Iterator[BatchNormContext]:
    """Give every FunctionalBatchNorm `ctx` for the duration of one forward call."""
    for layer in layers:
        layer.context = ctx
    try:
        yield ctx
    finally:
        for layer in layers:
            layer.context = None
