"""PartialFed (Sun, Huo, Yang, Bai, NeurIPS 2021): personalized FL through partial *initialization*.

Each round a client starts local training from a mix of the received global model and its own model from the
end of its previous round, chosen per layer by a loading strategy A_t^c (layer from global or kept local); it
then trains the whole model, and sends *all* of it; the server is plain FedAvg. Every state key is therefore
shared; what is personal is the client's model after local training (`PartialFedState.personal`), which it
deploys.

- PartialFed-Fix (`variant="fix"`): a fixed rule; layers matching `local_layers` keep their local values at round
  start. Entries are layer types ("bn" = BatchNorm, "norm" = any normalisation, "conv", "linear") or module
  paths ("head", "features.0"; a prefix matches the module and everything below it). Default: BatchNorm layers
  plus the classifier head, the paper's best hand-made strategy family (local BN, local top layers).
- PartialFed-Adaptive (`variant="adaptive"`): each layer l has a probability p_l (client state
  `PartialFedState.p`, initially `p_init`) of being loaded locally. Each round the client samples
  a_l ~ Bernoulli(p_l) with torch's global RNG, initializes with that strategy, and updates p from the training
  loss of the two candidate initializations of every layer: with L_l(local) and L_l(global) the loss on one
  probe mini-batch of the mixed model with layer l from the local resp. global model (all other layers as
  sampled),
      p_l <- clip(p_l - adaptive_lr * (L_l(local) - L_l(global)), p_min, 1 - p_min).
  Given the other layers, E[L] = p_l L_l(local) + (1 - p_l) L_l(global) is linear in p_l, so the step is a
  gradient step on the expected loss; it costs one forward pass of the probe batch per layer plus one.

Where this departs from, or fills in, the paper (its text for the adaptive strategy was not at hand when this
was written; the update above is our documented reading, not a transcription):
- The paper learns the strategy with its own parameterisation and schedule; here it is the finite-difference
  rule above. The probe batch (`train.batch_size` examples drawn with torch's global RNG from the training data
  under the evaluation transform) is scored with the model in eval mode, so the loss reflects each candidate's
  BatchNorm running statistics; p is updated before training (in `start`: the Bernoulli draw, then the probe
  batch's randperm and loader) and used from the next round on.
- A "layer" is a module that owns parameters or buffers directly (a conv, a linear, a BatchNorm with its
  running statistics). In a client's first round it has no local model, so it loads the global model whole.
- The deployed (evaluated) model is the client's model after its last local training; before it first trains,
  the received global model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from fedhet.algorithms.base import Algorithm, Capabilities
from fedhet.algorithms.registry import register
from fedhet.core.contract import ClientContext, ClientState, Deployment, FitStats, ServerState, Work
from fedhet.core.messages import Message
from fedhet.core.params import BN_TYPES, StateDict, load_partial, state_of
from fedhet.core.protocols import num_samples
from fedhet.errors import ConfigError
from fedhet.models.base import NORM_TYPES

LAYER_TYPES: dict[str, tuple[type[nn.Module], ...]] = {
    "bn": BN_TYPES, "norm": NORM_TYPES, "conv": (nn.Conv1d, nn.Conv2d, nn.Conv3d), "linear": (nn.Linear,)}
VARIANTS = ("fix", "adaptive")


@dataclass(kw_only=True)
class PartialFedState(ClientState):
    """The client's whole model after its last local training (None before it first trains) and, for the
    Adaptive variant, the per-layer probabilities p of loading a layer locally (None before the first draw)."""

    personal: StateDict | None = None
    p: torch.Tensor | None = None


@dataclass(kw_only=True)
class PartialFedWork(Work):
    """The fit's model (initialized from the chosen mix), the layers taken from the local model and the p to
    keep after the round."""

    chosen: frozenset[str] = frozenset()
    p: torch.Tensor | None = None


def layers_of(model: nn.Module) -> dict[str, list[str]]:
    """Module name -> the state-dict keys it owns directly, for every module that owns any (in model order)."""
    keys = set(model.state_dict())
    out: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        own = [prefix + k for k, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]]
        own = [k for k in own if k in keys]  # drops non-persistent buffers
        if own:
            out[name] = sorted(set(own))
    return out


def matching_layers(model: nn.Module, rules: list[str]) -> set[str]:
    """Names of the layers matched by type aliases or module-path prefixes; unmatched rules are errors."""
    layers, modules = layers_of(model), dict(model.named_modules())
    chosen: set[str] = set()
    for rule in rules:
        if rule in LAYER_TYPES:
            hit = {n for n in layers if isinstance(modules[n], LAYER_TYPES[rule])}
        else:
            hit = {n for n in layers if n == rule or n.startswith(rule + ".")}
        if not hit and rule not in LAYER_TYPES:
            raise ConfigError(f"partialfed: local_layers entry {rule!r} matches no layer; use one of "
                              f"{', '.join(LAYER_TYPES)} or a module path such as {next(iter(layers), 'head')!r}")
        chosen |= hit
    return chosen


@dataclass
class PartialFedParams:
    """variant: fix | adaptive; local_layers: the Fix rule; p_init/adaptive_lr/p_min: the Adaptive policy."""

    variant: str = "adaptive"
    local_layers: list[str] = field(default_factory=lambda: ["bn", "head"])
    p_init: float = 0.5
    adaptive_lr: float = 0.5
    p_min: float = 0.05

    def validate(self) -> None:
        if self.variant not in VARIANTS:
            raise ConfigError(f"partialfed: variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if not 0.0 <= self.p_min < 0.5:
            raise ConfigError(f"partialfed: p_min must be in [0, 0.5), got {self.p_min}")
        if not self.p_min <= self.p_init <= 1 - self.p_min:
            raise ConfigError(f"partialfed: p_init must be in [p_min, 1 - p_min], got {self.p_init}")
        if not self.adaptive_lr >= 0:
            raise ConfigError(f"partialfed: adaptive_lr must be >= 0, got {self.adaptive_lr}")


@register
class PartialFed(Algorithm[ServerState, PartialFedState, PartialFedWork, PartialFedParams]):
    """FedAvg whose clients start each round from a per-layer mix of the global and their own model."""

    name = "partialfed"
    personalized = True
    server_state_type = ServerState
    client_state_type = PartialFedState
    work_type = PartialFedWork
    Params = PartialFedParams
    capabilities = Capabilities(call_params=frozenset({"adaptive_lr", "p_init", "p_min"}))  # read in `start` only

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: forwarded to Algorithm.__init__
        super().__init__(*args, **kwargs)
        self.layers = layers_of(self.parts.template)
        self.fixed = frozenset(matching_layers(self.parts.template, list(self.params.local_layers)))

    def mix(self, model: nn.Module, glob: StateDict, local: StateDict, from_local: frozenset[str]) -> None:
        """Load every layer from `glob`, except the layers in `from_local`, which come from `local`."""
        load_partial(model, {k: v for k, v in glob.items() if k in self.parts.init_state})
        load_partial(model, {k: local[k] for n in from_local for k in self.layers[n]})

    @staticmethod
    def probe_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
        """Cross-entropy of `model` on the probe batch, without gradients."""
        with torch.no_grad():
            return float(nn.functional.cross_entropy(model(x), y))

    def adapt(self, model: nn.Module, msg: Message, local: StateDict, p: torch.Tensor, ctx: ClientContext
              ) -> tuple[frozenset[str], torch.Tensor]:
        """Sample the strategy a ~ Bernoulli(p), then move p along the per-layer loss difference (module doc)."""
        names = list(self.layers)
        a = torch.bernoulli(p).bool()
        chosen = frozenset(n for n, keep in zip(names, a.tolist(), strict=True) if keep)
        data = ctx.data.train_eval if ctx.data.train_eval is not None else ctx.data.train
        n = num_samples(data)
        if n == 0 or self.params.adaptive_lr == 0:
            return chosen, p
        idx = torch.randperm(n)[: min(self.train_cfg.batch_size, n)].tolist()
        x, y = next(iter(DataLoader(Subset(data, idx), batch_size=len(idx))))
        x, y = x.to(ctx.device), y.to(ctx.device)
        self.mix(model, msg.arrays, local, chosen)
        model.eval()
        sampled = self.probe_loss(model, x, y)
        diff = torch.zeros_like(p)
        for i, name in enumerate(names):
            other = local if name not in chosen else msg.arrays
            load_partial(model, {k: other[k] for k in self.layers[name]})
            flipped = self.probe_loss(model, x, y)
            source = msg.arrays if name not in chosen else local
            load_partial(model, {k: source[k] for k in self.layers[name]})  # restore
            diff[i] = (sampled - flipped) if name in chosen else (flipped - sampled)  # L(local) - L(global)
        lo, hi = self.params.p_min, 1 - self.params.p_min
        return chosen, (p - self.params.adaptive_lr * diff).clamp(lo, hi)

    def start(self, msg: Message, state: PartialFedState, ctx: ClientContext) -> PartialFedWork:
        """The round-start model: the global model with the chosen layers from the client's own model (Fix: the
        rule; Adaptive: a Bernoulli(p) draw, p updated on a probe batch); the whole global model at first."""
        model = self.parts.spare("workspace")
        local, p = state.personal, state.p
        chosen: frozenset[str] = frozenset()
        if local is not None and self.params.variant == "fix":
            chosen = self.fixed
        elif local is not None:
            start_p = p if p is not None else torch.full((len(self.layers),), float(self.params.p_init))
            chosen, p = self.adapt(model, msg, local, start_p, ctx)
        self.mix(model, msg.arrays, local or {}, chosen)
        return PartialFedWork(msg=msg, ctx=ctx, model=model, chosen=chosen, p=p)

    def finish(self, work: PartialFedWork, state: PartialFedState, stats: FitStats
               ) -> tuple[Message, PartialFedState]:
        """Send the whole trained model (with the number of locally loaded layers); keep it and p."""
        reply = self.parts.reply(work.model, stats)
        reply.scalars["local_layers"] = len(work.chosen)
        return reply, dataclasses.replace(state, personal=state_of(work.model), p=work.p)

    def deploy(self, msg: Message, state: PartialFedState, ctx: ClientContext) -> Deployment:
        """The client's model after its last local training (the received global model before that)."""
        model = self.parts.spare("workspace")
        self.mix(model, msg.arrays, {}, frozenset())
        if state.personal is not None:
            load_partial(model, state.personal)
        return Deployment(model)
