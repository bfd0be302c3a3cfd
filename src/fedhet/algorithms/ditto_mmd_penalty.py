"""The feature-space penalty D of Ditto + MMD (`fedhet.algorithms.ditto_mmd`): its hyperparameters, the client's
typed penalty state (MK-MMD weights, MMD-D kernels and their AdamW state, counters) and the per-fit session
that loads that state, re-fits and evaluates the kernels, and saves it again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhet.algorithms.ditto import DittoParams
from fedhet.core.params import StateDict
from fedhet.errors import ConfigError
from fedhet.losses import MKMMD, MKMMD_EXPONENTS, MMDD, cosine_similarity_penalty

PENALTIES = ("mkmmd", "mmdd", "cosine")
Features = dict[str, torch.Tensor]


@dataclass
class DittoMMDParams(DittoParams):
    """Ditto's lam / personal_epochs / schedule, plus: penalty (mkmmd | mmdd | cosine) and its weight mu;
    layers: module names whose outputs are constrained (None: ["features"], the feature extractor output);
    refit_interval: -1 every step on the batch, 0 never, k > 0 every k steps on n_accumulate batches;
    fixed_kernels: MK-MMD ablation, the first n of the 19 kernels with weights 1/n (no re-fit);
    kernel_steps: MMD-D AdamW steps per re-fit (None: 5 periodic, 25 with refit_interval -1); kernel_lr:
    MMD-D AdamW lr; normalize_features: MK-MMD on unit-L2 features."""

    penalty: str = "mkmmd"
    mu: float = 0.1
    layers: list[str] | None = None
    refit_interval: int = 20
    n_accumulate: int = 50
    fixed_kernels: int | None = None
    kernel_steps: int | None = None
    kernel_lr: float = 1e-3
    normalize_features: bool = True

    def validate(self) -> None:
        super().validate()
        if self.penalty not in PENALTIES:
            raise ConfigError(f"ditto_mmd: penalty must be one of {', '.join(PENALTIES)}, got {self.penalty!r}")
        if not self.mu >= 0:
            raise ConfigError(f"ditto_mmd: mu must be >= 0, got {self.mu}")
        if self.layers is not None and (not self.layers or not all(self.layers)):
            raise ConfigError(f"ditto_mmd: layers must be a non-empty list of module names (or null), "
                              f"got {self.layers!r}")
        if self.refit_interval < -1:
            raise ConfigError(f"ditto_mmd: refit_interval must be -1, 0 or positive, got {self.refit_interval}")
        if self.n_accumulate < 1:
            raise ConfigError(f"ditto_mmd: n_accumulate must be >= 1, got {self.n_accumulate}")
        if self.fixed_kernels is not None and (self.penalty != "mkmmd"
                                               or not 1 <= self.fixed_kernels <= len(MKMMD_EXPONENTS)):
            raise ConfigError(f"ditto_mmd: fixed_kernels must be in 1..{len(MKMMD_EXPONENTS)} with penalty "
                              f"mkmmd (or null), got {self.fixed_kernels} with {self.penalty}")
        if self.kernel_steps is not None and (self.penalty != "mmdd" or self.kernel_steps < 1):
            raise ConfigError(f"ditto_mmd: kernel_steps must be >= 1 with penalty mmdd (or null), "
                              f"got {self.kernel_steps} with {self.penalty}")
        if not self.kernel_lr > 0:
            raise ConfigError(f"ditto_mmd: kernel_lr must be > 0, got {self.kernel_lr}")


@dataclass(kw_only=True)
class MMDDKernelState:
    """One layer's MMD-D kernel: its parameters and (once it has been trained) its AdamW state, on the CPU."""

    params: StateDict
    optim: dict[str, Any] | None = None  # Any: torch optimizer state_dict


@dataclass(kw_only=True)
class PenaltyState:
    """A client's penalty between rounds: MK-MMD weights beta and MMD-D kernels by layer (a layer appears once
    its kernel exists), the cumulative personal steps and kernel re-fits."""

    beta: dict[str, torch.Tensor] = field(default_factory=dict)
    mmdd: dict[str, MMDDKernelState] = field(default_factory=dict)
    steps: int = 0
    refits: int = 0


class PenaltySession:
    """One client's penalty D for one fit: kernels per layer and counters, loaded from its `PenaltyState`
    (not modified) and returned as a new one by `state()`."""

    def __init__(self, params: DittoMMDParams, layers: list[str], saved: PenaltyState, device: torch.device
                 ) -> None:
        self.params, self.layers, self.device, self.saved = params, layers, device, saved
        check_saved(params, layers, saved)
        self.steps, self.refits = saved.steps, saved.refits
        self.round_step = 0
        self.last_objective: dict[str, list[float]] = {}  # MMD-D: J before each kernel step of the last re-fit
        self.mkmmd: dict[str, MKMMD] = {}
        self.mmdd: dict[str, MMDD] = {}
        if params.penalty == "mkmmd":
            for layer in layers:
                self.mkmmd[layer] = self._mkmmd(saved.beta.get(layer))

    @property
    def learns(self) -> bool:
        """Whether this penalty has kernels to re-fit under the schedule."""
        p = self.params
        return p.penalty != "cosine" and p.fixed_kernels is None and p.refit_interval != 0

    def _mkmmd(self, beta: torch.Tensor | None) -> MKMMD:
        p = self.params
        m = (MKMMD.fixed_uniform(p.fixed_kernels, normalize_features=p.normalize_features) if p.fixed_kernels
             else MKMMD(normalize_features=p.normalize_features))
        if beta is not None:
            m.beta.copy_(beta)
        return m.to(self.device)

    def _mmdd(self, layer: str, in_features: int) -> MMDD:
        """The layer's MMD-D kernel, created at its first use (random init from the global RNG, then the saved
        parameters and AdamW state when the client has them)."""
        if layer not in self.mmdd:
            m = MMDD(in_features, lr=self.params.kernel_lr).to(self.device)
            saved = self.saved.mmdd.get(layer)
            if saved is not None:
                m.load_state_dict(saved.params)
                if saved.optim is not None:
                    m.optimizer = torch.optim.AdamW(m.parameters(), lr=m.lr)
                    m.optimizer.load_state_dict(copy.deepcopy(saved.optim))  # torch aliases "step"
            self.mmdd[layer] = m
        return self.mmdd[layer]

    def penalty(self, local: Features, ref: Features) -> torch.Tensor:
        """sum over layers of D(local, ref) (differentiable w.r.t. local)."""
        total = torch.zeros((), device=self.device)
        for layer in self.layers:
            x, y = local[layer], ref[layer]
            if self.params.penalty == "cosine":
                total = total + cosine_similarity_penalty(x, y)
            elif self.params.penalty == "mkmmd":
                total = total + self.mkmmd[layer](x, y).to(total.dtype)
            elif x.shape[0] >= 2:  # MMD-D's unbiased statistic needs two samples
                total = total + self._mmdd(layer, x.shape[1])(x, y)
        return total

    def fit(self, local: Features, ref: Features, kernel_steps: int) -> bool:
        """Re-fit every layer's kernel on detached paired features; False (kernels kept) when there is nothing
        to fit on (fewer than 2 samples, or local == reference features)."""
        if not self.learns or any(local[k].shape[0] < 2 for k in self.layers):
            return False
        if all(torch.equal(local[k], ref[k]) for k in self.layers):
            return False
        for layer in self.layers:
            x, y = local[layer].detach(), ref[layer].detach()
            if self.params.penalty == "mkmmd":
                self.mkmmd[layer].fit_weights(x, y)
            else:
                with torch.enable_grad():
                    self.last_objective[layer] = self._mmdd(layer, x.shape[1]).train_steps(x, y, kernel_steps)
        self.refits += 1
        return True

    def state(self) -> PenaltyState:
        """The client's new penalty state, as CPU tensors (layers without a kernel this fit keep the saved one)."""
        beta = {layer: m.beta.detach().cpu().clone() for layer, m in self.mkmmd.items()}
        mmdd = {layer: MMDDKernelState(params={k: v.detach().cpu().clone() for k, v in m.state_dict().items()},
                                       optim=None if m.optimizer is None else to_cpu(copy.deepcopy(
                                           m.optimizer.state_dict())))
                for layer, m in self.mmdd.items()}
        return PenaltyState(beta={**self.saved.beta, **beta}, mmdd={**self.saved.mmdd, **mmdd}, steps=self.steps,
                            refits=self.refits)


def check_saved(params: DittoMMDParams, layers: list[str], saved: PenaltyState) -> None:
    """Refuse a saved penalty state this configuration would not use (another penalty or other layers, e.g. a
    resume with changed method_args): its kernels would otherwise be silently dropped or re-created."""
    for kind, kernels in (("mkmmd", saved.beta), ("mmdd", saved.mmdd)):
        unused = sorted(set(kernels) - (set(layers) if kind == params.penalty else set()))
        if unused:
            raise ConfigError(f"ditto_mmd: the client state holds {kind} kernels for layers {unused}, which "
                              f"penalty {params.penalty} on layers {layers} does not use")


def to_cpu(obj: Any) -> Any:  # Any: a torch state tree
    """Tensors of a nested dict / list structure (an optimizer state) moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    return obj
