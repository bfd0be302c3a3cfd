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
counters) is the client state's typed `penalty` field (`PenaltyState`, fedhet.algorithms.ditto_mmd_penalty);
a fit loads it into a `PenaltySession` kept in its work (`DittoMMDWork.session`) and `finish` stores the
session's new state. Like the personal model it never leaves the client: the reply is Ditto's (w only).

Choices where the spec leaves room (see docs/ditto_mmd.md):
- The step counter of the schedule restarts every round (FL4Health counts local steps per round), so a round
  always starts with a re-fit against its new w_ref; `penalty.steps` / `penalty.refits` are cumulative
  counters for diagnostics.
- A re-fit is skipped (kernels kept) when local and reference features are identical (round 1, step 0, where
  v = w_ref: there is nothing to fit, and MK-MMD would fall back to a meaningless one-hot) or n < 2.
- Periodic re-fits use exactly `n_accumulate` batches (FL4Health takes n_accumulate + 1).
- beta starts uniform (FL4Health: random); MMD-D kernels are created at the client's first penalty evaluation.
- A client state holding kernels the configured penalty / layers would not use is refused (ConfigError), never
  silently dropped.
- Default layer: ``features``, the output of the SplitModel's feature extractor (the paper's "depth 1" choice).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from fedhet.algorithms.base import Capabilities
from fedhet.algorithms.ditto import DittoFamily, DittoState, DittoWork
from fedhet.algorithms.ditto_mmd_penalty import PENALTIES, DittoMMDParams, Features, PenaltySession, PenaltyState
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientContext, FitStats
from fedhet.core.features import check_layers, forward_with_features
from fedhet.core.messages import Message
from fedhet.losses import KernelWeightSchedule

__all__ = ["PENALTIES", "DittoMMD", "DittoMMDParams", "DittoMMDState", "DittoMMDWork", "PenaltySession",
           "PenaltyState"]


@dataclass(kw_only=True)
class DittoMMDState(DittoState):
    """Ditto's state (personal model v) plus the client's penalty kernels and counters."""

    penalty: PenaltyState = field(default_factory=PenaltyState)


@dataclass(kw_only=True)
class DittoMMDWork(DittoWork):
    """Ditto's w, w_ref and v, plus the penalty session of this fit (kernels, schedule position)."""

    session: PenaltySession


@register
class DittoMMD(DittoFamily[DittoMMDState, DittoMMDWork, DittoMMDParams]):
    """Ditto whose personal model is also pulled towards w_ref in feature space (MK-MMD, MMD-D or cosine)."""

    name = "ditto_mmd"
    Params = DittoMMDParams
    # read in the personal loss / config and in `passes` only (not kernel_lr: a client's saved kernel optimizer
    # keeps the lr it was made with)
    capabilities = Capabilities(call_params=frozenset({"lam", "mu", "personal_epochs", "schedule", "kernel_steps"}))
    client_state_type = DittoMMDState
    work_type = DittoMMDWork

    def __init__(self, params: DittoMMDParams, *args: Any, **kwargs: Any) -> None:  # Any: to Algorithm.__init__
        super().__init__(params, *args, **kwargs)
        self.layers: list[str] = list(params.layers) if params.layers else ["features"]
        check_layers(self.parts.template, self.layers)
        self.schedule = KernelWeightSchedule(params.refit_interval, params.n_accumulate)

    @property
    def kernel_steps(self) -> int:
        """MMD-D optimisation steps per re-fit: 5 periodic, 25 per step (paper §4), unless set."""
        if self.params.kernel_steps is not None:
            return int(self.params.kernel_steps)
        return 25 if self.schedule.per_step else 5

    def session(self, state: DittoMMDState) -> PenaltySession:
        """A penalty session loaded from the client's state (its `penalty` field; not modified)."""
        return PenaltySession(self.params, self.layers, state.penalty, self.device)

    # ------------------------------------------------------------------ the personal objective (Eq. 4)
    def personal_loss(self, work: DittoMMDWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE(v(x), y) + (lam/2)||v - w_ref||^2 + mu * sum_l D(f^l_v(x), f^l_wref(x)); one call = one personal step
        (re-fits the kernels of `work.session` first when the schedule says so)."""
        personal, reference, session = work.personal, work.reference, work.session
        logits, local = forward_with_features(personal, x, self.layers)
        loss = F.cross_entropy(logits, y) + self.proximal(personal, reference)
        if self.params.mu == 0:
            return loss
        with torch.no_grad():
            ref = forward_with_features(reference, x, self.layers)[1]
        if session.learns and self.schedule.refit_due(session.round_step):
            if self.schedule.per_step:
                session.fit(local, ref, self.kernel_steps)
            else:
                session.fit(*self.accumulate(work), self.kernel_steps)
        session.round_step += 1
        session.steps += 1
        return loss + self.params.mu * session.penalty(local, ref)

    @torch.no_grad()
    def accumulate(self, work: DittoMMDWork) -> tuple[Features, Features]:
        """Features of v (eval mode) and w_ref on `n_accumulate` shuffled training batches, concatenated."""
        personal, reference, ctx = work.personal, work.reference, work.ctx
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
    def start(self, msg: Message, state: DittoMMDState, ctx: ClientContext) -> DittoMMDWork:
        """Ditto's w, w_ref and v, with the penalty session loaded from the client's state."""
        session = self.session(state)
        model = self.client_model(msg, state)
        reference = self.reference_model(model)
        return DittoMMDWork(msg=msg, ctx=ctx, model=model, reference=reference,
                            personal=self.personal_model(state, reference), session=session)

    def finish(self, work: DittoMMDWork, state: DittoMMDState, stats: FitStats) -> tuple[Message, DittoMMDState]:
        """Ditto's reply and state, with the session's penalty state."""
        reply, new_state = super().finish(work, state, stats)
        return reply, dataclasses.replace(new_state, penalty=work.session.state())
