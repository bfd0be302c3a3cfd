"""Ditto with adaptive latent-space constraints (Ayromlou & Emerson 2025, arXiv 2505.07525 v1; spec ditto_mmd.md).

Ditto (see `fedhet.algorithms.ditto`) whose personal objective gains a feature-space penalty, Eq. (4) of the
paper (reconstructed in spec §2.1):

    L_k(v; b) = CE(v(x_b), y_b) + (lam/2) ||v - w_ref||^2 + mu * sum_{layers l} D(f^l_v(x_b), f^l_{w_ref}(x_b))

with w_ref the frozen round-start global model (eval mode, no gradients: D's gradient reaches v only) and D one of

- ``mkmmd``: MK-MMD (spec §2.3, `fedhet.losses.MKMMD`): 19 RBFs gamma = 2^-3.5 ... 2^1 on unit-normalised features,
  weights beta fitted by the test-power QP. ``fixed_kernels: n`` is the Fig. 3 (right) ablation: the first n
  kernels with fixed weights 1/n, never re-fitted;
- ``mmdd``: MMD-D deep kernel (spec §2.4, `fedhet.losses.MMDD`), trained by AdamW to maximise MMD_u^2 / sigma;
  the penalty is MMD_u^2 with the kernel frozen;
- ``cosine``: the paired baseline mean_b (1 - cos(f_v(x_b), f_w(x_b))) (spec §2.5 [S]).

Kernel schedule (`refit_interval`, `fedhet.losses.KernelWeightSchedule`): k > 0 re-fits before personal steps
0, k, 2k, ... of each round on the features of `n_accumulate` training batches (local model in eval mode, no grad;
spec MK-MMD_20 / periodic MMD-D with `kernel_steps` 5); -1 re-fits before every step on that step's batch
(MK-MMD_-1 / MMD-D with 25 steps); 0 never re-fits. "X alone" (Table 1) is lam = 0; plain Ditto is mu = 0.

Per-client penalty state (beta per layer; MMD-D kernel parameters and AdamW state per layer; step and re-fit
counters) lives in ``state["penalty"]`` and, like the personal model, never leaves the client: the reply is
Ditto's (the global model w only).

Choices where the spec leaves room (see docs/ditto_mmd.md):
- The step counter of the schedule restarts every round (FL4Health counts local steps per round), so a round
  always starts with a re-fit against its new w_ref; ``state["penalty"]["steps"]`` / ``["refits"]`` are
  cumulative counters for diagnostics.
- A re-fit is skipped (kernels kept) when local and reference features are identical (round 1, step 0, where
  v = w_ref: there is nothing to fit, and MK-MMD would fall back to a meaningless one-hot) or n < 2.
- Periodic re-fits use exactly `n_accumulate` batches (FL4Health takes n_accumulate + 1).
- beta starts uniform (FL4Health: random); MMD-D kernels are created at the client's first penalty evaluation.
- Default layer: ``features``, the output of the SplitModel's feature extractor (the paper's "depth 1" choice).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from fedhet.algorithms.base import ClientContext, ClientState
from fedhet.algorithms.ditto import Ditto
from fedhet.algorithms.registry import register
from fedhet.engine.features import check_layers, forward_with_features
from fedhet.engine.messages import Message
from fedhet.errors import ConfigError
from fedhet.losses import MKMMD, MKMMD_EXPONENTS, MMDD, KernelWeightSchedule, cosine_similarity_penalty
from fedhet.models import SplitModel

PENALTIES = ("mkmmd", "mmdd", "cosine")
Features = dict[str, torch.Tensor]
SESSION_KEY = "ditto_mmd_session"


class PenaltySession:
    """One client's penalty D for one fit: kernels per layer and counters, loaded from / saved to its state."""

    def __init__(self, params: DittoMMD.Params, layers: list[str], saved: dict[str, Any], device: torch.device
                 ) -> None:
        self.params, self.layers, self.device = params, layers, device
        self.saved_layers: dict[str, Any] = saved.get("layers", {})
        self.steps, self.refits = int(saved.get("steps", 0)), int(saved.get("refits", 0))
        self.round_step = 0
        self.last_objective: dict[str, list[float]] = {}  # MMD-D: J before each kernel step of the last re-fit
        self.kernels: dict[str, nn.Module] = {}
        if params.penalty == "mkmmd":
            for layer in layers:
                self.kernels[layer] = self._mkmmd(self.saved_layers.get(layer, {}).get("beta"))

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
        if layer not in self.kernels:
            m = MMDD(in_features, lr=self.params.kernel_lr).to(self.device)
            saved = self.saved_layers.get(layer)
            if saved is not None:
                m.load_state_dict(saved["kernel"])
                if saved.get("optim") is not None:
                    m.optimizer = torch.optim.AdamW(m.parameters(), lr=m.lr)
                    m.optimizer.load_state_dict(copy.deepcopy(saved["optim"]))  # torch aliases "step"
            self.kernels[layer] = m
        return self.kernels[layer]  # type: ignore[return-value]

    def penalty(self, local: Features, ref: Features) -> torch.Tensor:
        """sum over layers of D(local, ref) (differentiable w.r.t. local)."""
        total = torch.zeros((), device=self.device)
        for layer in self.layers:
            x, y = local[layer], ref[layer]
            if self.params.penalty == "cosine":
                total = total + cosine_similarity_penalty(x, y)
            elif self.params.penalty == "mkmmd":
                total = total + self.kernels[layer](x, y).to(total.dtype)
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
                self.kernels[layer].fit_weights(x, y)  # type: ignore[operator]
            else:
                with torch.enable_grad():
                    self.last_objective[layer] = self._mmdd(layer, x.shape[1]).train_steps(x, y, kernel_steps)
        self.refits += 1
        return True

    def state(self) -> dict[str, Any]:
        """The client's penalty state as plain CPU tensors / dicts / numbers."""
        layers: dict[str, Any] = {}
        for layer, m in self.kernels.items():
            if isinstance(m, MKMMD):
                layers[layer] = {"beta": m.beta.detach().cpu().clone()}
            elif isinstance(m, MMDD):
                optim = None if m.optimizer is None else _to_cpu(copy.deepcopy(m.optimizer.state_dict()))
                layers[layer] = {"kernel": {k: v.detach().cpu().clone() for k, v in m.state_dict().items()},
                                 "optim": optim}
        return {"layers": {**self.saved_layers, **layers}, "steps": self.steps, "refits": self.refits}


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


@register
class DittoMMD(Ditto):
    """Ditto whose personal model is also pulled towards w_ref in feature space (MK-MMD, MMD-D or cosine)."""

    name = "ditto_mmd"

    @dataclass
    class Params(Ditto.Params):
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

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.layers: list[str] = list(params.layers) if params.layers else ["features"]
        check_layers(self._template, self.layers)
        self.schedule = KernelWeightSchedule(params.refit_interval, params.n_accumulate)

    @property
    def kernel_steps(self) -> int:
        """MMD-D optimisation steps per re-fit: 5 periodic, 25 per step (paper §4), unless set."""
        if self.params.kernel_steps is not None:
            return int(self.params.kernel_steps)
        return 25 if self.schedule.per_step else 5

    def session(self, state: ClientState) -> PenaltySession:
        """A penalty session loaded from the client's state (its `penalty` entry; not modified)."""
        return PenaltySession(self.params, self.layers, state.get("penalty", {}), self.device)

    def with_session(self, ctx: ClientContext, session: PenaltySession) -> ClientContext:
        """`ctx` carrying `session` for `personal_loss`."""
        return dataclasses.replace(ctx, extra={**ctx.extra, SESSION_KEY: session})

    # ------------------------------------------------------------------ the personal objective (Eq. 4)
    def personal_loss(self, personal: SplitModel, reference: SplitModel, x: torch.Tensor, y: torch.Tensor,
                      ctx: ClientContext) -> torch.Tensor:
        """CE(v(x), y) + (lam/2)||v - w_ref||^2 + mu * sum_l D(f^l_v(x), f^l_wref(x)); one call = one personal step
        (re-fits the kernels first when the schedule says so)."""
        logits, local = forward_with_features(personal, x, self.layers)
        loss = F.cross_entropy(logits, y) + self.proximal(personal, reference)
        if self.params.mu == 0:
            return loss
        session: PenaltySession = ctx.extra.get(SESSION_KEY) or self.session({})
        with torch.no_grad():
            ref = forward_with_features(reference, x, self.layers)[1]
        if session.learns and self.schedule.refit_due(session.round_step):
            if self.schedule.per_step:
                session.fit(local, ref, self.kernel_steps)
            else:
                session.fit(*self.accumulate(personal, reference, ctx), self.kernel_steps)
        session.round_step += 1
        session.steps += 1
        return loss + self.params.mu * session.penalty(local, ref)

    @torch.no_grad()
    def accumulate(self, personal: nn.Module, reference: nn.Module, ctx: ClientContext) -> tuple[Features, Features]:
        """Features of v (eval mode) and w_ref on `n_accumulate` shuffled training batches, concatenated."""
        was_training = personal.training
        personal.eval()
        local: dict[str, list[torch.Tensor]] = {k: [] for k in self.layers}
        ref: dict[str, list[torch.Tensor]] = {k: [] for k in self.layers}
        loader = DataLoader(ctx.data.train, batch_size=self.train_cfg.batch_size, shuffle=True)
        for i, (xb, _) in enumerate(loader):
            if i == self.schedule.n_accumulate:
                break
            xb = xb.to(ctx.device)
            for out, model in ((local, personal), (ref, reference)):
                for k, f in forward_with_features(model, xb, self.layers)[1].items():
                    out[k].append(f)
        personal.train(was_training)
        return ({k: torch.cat(v) for k, v in local.items()}, {k: torch.cat(v) for k, v in ref.items()})

    # ------------------------------------------------------------------ client side
    def fit(self, msg: Message, state: ClientState, ctx: ClientContext) -> tuple[Message, ClientState]:
        """Ditto's fit with the client's penalty session; its state is returned in `state["penalty"]`."""
        session = self.session(state)
        reply, new_state = super().fit(msg, state, self.with_session(ctx, session))
        new_state["penalty"] = session.state()
        return reply, new_state
