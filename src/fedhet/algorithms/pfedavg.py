"""pFedAvg: "FedAvg with local model personalization", the FedAvg + fine-tuning baseline of FRAug
(Chen, Frikha, Krompass, Gu, Tresp, "FRAug: Tackling Federated Learning with Non-IID Features via
Representation Augmentation", ICCV 2023; a row of its results tables).
FedAvg itself is McMahan et al., AISTATS 2017 (Algorithm 1).

FRAug does not say how the local personalization is done; this implementation makes the common choice of
personalization by local fine-tuning (as in Wang et al. 2019, "Federated Evaluation of On-device
Personalization", and the FedBABU evaluation protocol):

- Federated training is exactly FedAvg (every key shared, cross-entropy, weighted averaging); what is
  communicated and aggregated is never affected by the fine-tuning.
- A client's deployed model is the current global model fine-tuned on that client's own *training* split for
  `finetune_epochs` epochs of mini-batch SGD (the train config's optimizer, batch size, momentum, weight decay
  and grad clipping; learning rate `finetune_lr`, default `train.lr`; `train.local_steps` is ignored here).
- `finetune_part="all"` fine-tunes every parameter; `"head"` only the classifier head, the body's parameters
  frozen (excluded from the optimizer). In both modes the model runs in train mode, so BatchNorm running
  statistics adapt to the client's data, in the body too.
- The fine-tune is the deployment's pass (`Deployment.passes`, a fresh optimizer each time) on a scratch copy:
  the client state is not changed and no fine-tuned weights persist to the next round (each evaluation
  re-personalizes the latest global model). The fine-tune's data order is drawn from torch's global RNG,
  which the engine seeds per (seed, round, client, "evaluate"), so the test and val evaluations of a round see
  the same deployed model.
- `finetune_epochs=0` deploys the global model unchanged (plain FedAvg evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fedhet.algorithms.base import Capabilities, ModelAlgorithm
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientContext, ClientState, Deployment, LocalPass, OptimSpec, Work, minimize
from fedhet.core.messages import Message
from fedhet.errors import ConfigError
from fedhet.models import SplitModel

FINETUNE_PARTS = ("all", "head")


@dataclass
class PFedAvgParams:
    """finetune_epochs: local fine-tuning epochs at deployment (>= 0); finetune_part: all | head;
    finetune_lr: fine-tuning learning rate (None: train.lr)."""

    finetune_epochs: int = 1
    finetune_part: str = "all"
    finetune_lr: float | None = None

    def validate(self) -> None:
        if self.finetune_epochs < 0:
            raise ConfigError(f"finetune_epochs must be >= 0, got {self.finetune_epochs}")
        if self.finetune_part not in FINETUNE_PARTS:
            raise ConfigError(f"finetune_part must be one of {', '.join(FINETUNE_PARTS)}, "
                              f"got {self.finetune_part!r}")
        if self.finetune_lr is not None and not self.finetune_lr > 0:
            raise ConfigError(f"finetune_lr must be > 0 (or null for train.lr), got {self.finetune_lr}")


@register
class PFedAvg(ModelAlgorithm[PFedAvgParams]):
    """FedAvg training; each client deploys the global model fine-tuned on its own training data."""

    name = "pfedavg"
    personalized = True
    Params = PFedAvgParams
    # read in `deploy` only
    capabilities = Capabilities(call_params=frozenset({"finetune_epochs", "finetune_lr", "finetune_part"}))

    def finetune_pass(self, work: Work, model: SplitModel) -> LocalPass:
        """`finetune_epochs` epochs of `model` on the client's training split (the personalization step), with a
        fresh optimizer at `finetune_lr`; the body frozen when only the head is fine-tuned."""
        p = self.params
        cfg = replace(self.train_cfg, local_epochs=p.finetune_epochs, local_steps=None)
        spec = OptimSpec.from_train(list(model.parameters()), cfg, lr=p.finetune_lr, persist=False)
        body = tuple(model.features.parameters()) if p.finetune_part == "head" else ()
        return LocalPass("fine-tune", minimize(lambda x, y: self.loss(work, x, y)), {"model": spec}, cfg,
                         modules=(model,), frozen=body, report=False)

    def deploy(self, msg: Message, state: ClientState, ctx: ClientContext) -> Deployment:
        """The received model (+ local part) on a scratch copy, fine-tuned by the deployment's pass; `state` is
        left untouched."""
        model = self.client_model(msg, state, "scratch")  # every key loaded: nothing leaks between clients
        if self.params.finetune_epochs == 0:
            return Deployment(model)
        return Deployment(model, passes=[self.finetune_pass(Work(msg=msg, ctx=ctx, model=model), model)])
