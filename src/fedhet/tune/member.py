"""One configuration of a tuning population, FedPop's "member" (spec fedpop.md §2.1): its server vector alpha,
its client centre beta^0, the active clients' local vectors beta^k, its own federation (server state, client
states) and its score history; and the method copies that train and aggregate with those hyperparameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fedhet.algorithms.base import AnyAlgorithm, with_hparams
from fedhet.config import ExperimentConfig
from fedhet.core.contract import ClientState, ServerState
from fedhet.engine.experiment import Experiment, build_algorithm, make_model_fn
from fedhet.errors import ConfigError
from fedhet.tune.apply import apply_vector, hparams_of, vector_to_dict
from fedhet.tune.fedex import FedExState
from fedhet.tune.keys import build_time
from fedhet.tune.space import HPValue, HPVector, SearchSpace, Space

AnyAlgorithm = AnyAlgorithm
MAX_CACHED = 1024


@dataclass
class Member:
    """A configuration and its federation. `betas` are beta^1..beta^K of the current local search (empty:
    resample around `beta0` next round, spec §2.2) and `beta_history[k]` the validation losses beta^k scored
    since it was set (FedPop-L's discounted score); `history` holds s_i per round (the mean validation loss of
    its active clients, §2.5) since it was (re)initialised in round `born`, `weighted_last` the last round's
    validation-size-weighted mean (the official code's FedPop-G score); `parent` is the slot it was copied from
    by FedPop-G (None for an initial configuration)."""

    slot: int
    alpha: HPVector
    beta0: HPVector
    server: ServerState
    clients: dict[int, ClientState] = field(default_factory=dict)
    betas: list[HPVector] = field(default_factory=list)
    beta_history: list[list[float]] = field(default_factory=list)
    history: list[float] = field(default_factory=list)
    weighted_last: float = float("inf")
    born: int = 0
    parent: int | None = None
    alive: bool = True
    fedex: FedExState | None = None  # tune.clients=fedex: its candidates and distribution
    best_local: int | None = None  # FedPop-L's best local vector at its last step (tune.l_after: best)

    def values(self, space: SearchSpace) -> dict[str, HPValue]:
        """{dotted key: config value} of Concat(alpha, beta^0): the configuration as a user would set it."""
        return vector_to_dict(space.joint, {**self.alpha, **self.beta0})


class MethodCopies:
    """Copies of the experiment's method configured with an HP vector (`with_hparams`), resolved once per
    distinct vector: a client trains with Concat(alpha_i, beta_i^k), a member aggregates with
    Concat(alpha_i, beta_i^0). A vector's build-time values (`build_keys`: model.args.* and method_args the
    method reads when it is built, tune/keys.py) select the method and model built from that configuration
    (`build`): the experiment's own when the space has none, else one build per distinct set of values, shared by
    the members that have it (so the batched runtime lanes them together, and only them)."""

    def __init__(self, exp: Experiment, space: SearchSpace) -> None:
        self.exp, self.cfg, self.base, self.space = exp, exp.config, exp.algorithm, space
        self.build_keys = tuple(k for k in space.joint.dims if build_time(k, exp.config))
        self._builds: dict[tuple[tuple[str, float], ...], AnyAlgorithm] = {}
        self._cache: dict[tuple[tuple[str, float], ...], AnyAlgorithm] = {}

    def build(self, vec: Mapping[str, float]) -> AnyAlgorithm:
        """The method (and model) built with `vec`'s build-time values and the experiment's other settings."""
        if not self.build_keys:
            return self.base
        key = tuple((k, float(vec[k])) for k in self.build_keys)
        if key not in self._builds:
            sub = Space({k: self.space.joint.dims[k] for k in self.build_keys})
            self._builds[key] = self._built(apply_vector(self.cfg, sub, dict(key)),
                                            f": the member values {vector_to_dict(sub, dict(key))} do not build",
                                            "those keys' bounds")
        return self._builds[key]

    def _built(self, cfg: ExperimentConfig, what: str, narrow: str) -> AnyAlgorithm:
        """The method and model `cfg` builds on the experiment's data; one clear error (`what` fails to build:
        narrow `narrow`) where the method or model refuses it."""
        try:
            return build_algorithm(cfg, self.exp.data, self.exp.device, make_model_fn(cfg, self.exp.data))
        except (TypeError, ValueError, RuntimeError, ConfigError) as err:
            raise ConfigError(f"search space{what} ({type(err).__name__}: {err}); narrow {narrow}") from err

    def check_builds(self) -> None:
        """Build each `choice` value and the ends of every other dimension of a build-time, `train.*` or
        `server.*` key (one key at a time, the others at the experiment's values), so a value the method or model
        refuses when it is built (FedDyn: a server optimizer; FedNova: a non-SGD client optimizer) is one clear
        error before any training, as it is for `fedhet run` (a copy, `with_hparams`, would not check it)."""
        checked = [k for k in self.space.joint.dims if k in self.build_keys or k.startswith(("train.", "server."))]
        for key in checked:
            dim = self.space.joint.dims[key]
            for pos in range(len(dim.grid)) if dim.kind == "choice" else sorted({dim.low, dim.high}):
                self._built(apply_vector(self.cfg, Space({key: dim}), {key: pos}),
                            f" '{key}': the value {dim.value(pos)!r} it can take does not build", "its bounds")

    def of(self, alpha: Mapping[str, float], beta: Mapping[str, float]) -> AnyAlgorithm:
        """The method with alpha's server and beta's client hyperparameters (built with alpha's build-time values)."""
        vec = {**alpha, **beta}
        key = tuple(sorted((k, float(v)) for k, v in vec.items()))
        if key not in self._cache:
            if len(self._cache) >= MAX_CACHED:  # continuous local vectors rarely repeat: keep the cache bounded
                self._cache.clear()
            train, server, params = hparams_of(self.cfg, self.space.joint, vec)
            self._cache[key] = with_hparams(self.build(vec), train=train, server=server, params=params)
        return self._cache[key]
