"""One configuration of a tuning population, FedPop's "member" (spec fedpop.md §2.1): its server vector alpha,
its client centre beta^0, the active clients' local vectors beta^k, its own federation (server state, client
states) and its score history; and the method copies that train and aggregate with those hyperparameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fedhet.algorithms.base import AnyAlgorithm, with_hparams
from fedhet.config import ExperimentConfig
from fedhet.core.contract import ClientState, ServerState
from fedhet.tune.apply import hparams_of, vector_to_dict
from fedhet.tune.fedex import FedExState
from fedhet.tune.space import HPValue, HPVector, SearchSpace

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
    """Copies of the experiment's method configured with an HP vector (`with_hparams`), resolved once
    per distinct vector: a client trains with Concat(alpha_i, beta_i^k), a member aggregates with
    Concat(alpha_i, beta_i^0)."""

    def __init__(self, cfg: ExperimentConfig, base: AnyAlgorithm, space: SearchSpace) -> None:
        self.cfg, self.base, self.space = cfg, base, space
        self._cache: dict[tuple[tuple[str, float], ...], AnyAlgorithm] = {}

    def of(self, alpha: Mapping[str, float], beta: Mapping[str, float]) -> AnyAlgorithm:
        """The method with alpha's server and beta's client hyperparameters."""
        vec = {**alpha, **beta}
        key = tuple(sorted((k, float(v)) for k, v in vec.items()))
        if key not in self._cache:
            if len(self._cache) >= MAX_CACHED:  # continuous local vectors rarely repeat: keep the cache bounded
                self._cache.clear()
            train, server, params = hparams_of(self.cfg, self.space.joint, vec)
            self._cache[key] = with_hparams(self.base, train=train, server=server, params=params)
        return self._cache[key]
