"""The `tune` section of a config (read by `fedhet tune` only; plain runs ignore it): which wrapper (RS / SHA,
spec fedpop.md §2.6-2.8), how the active clients' local vectors are chosen (fixed, the Delta-ball, FedEx),
whether FedPop-L and FedPop-G run, and their coefficients (§2.10). `rounds` of the experiment is R_c, each
configuration's budget. Defaults are the paper's; where it is silent, the official code's or ours, as each
comment says (docs/tune.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.config import ExperimentConfig
from fedhet.config.typed import from_dict
from fedhet.errors import ConfigError, unknown_choice
from fedhet.tune.space import SearchSpace, load_space, parse_space

SpaceSpec = Any  # Any: `tune.space` as parsed from YAML (a preset name, a file path or an inline mapping)

WRAPPERS = ("rs", "sha")
CLIENT_VECTORS = ("fixed", "ball", "fedex")
SCORES = ("powerlaw", "avg", "last", "last_weighted")
L_SCORES = ("discounted", "round")
SPLITS = ("official", "rank", "quantile")
SELECTIONS = ("val", "test")
SAMPLINGS = ("shared", "per_member")
L_AFTER = ("best", "keep")
G_BETA_EPS = ("double", "annealed")
FEDEX_CANDIDATES = ("perturb", "space")
FEDEX_SCHEDS = ("aggressive", "auto")


@dataclass
class TuneConfig:
    """How `fedhet tune` searches (spec fedpop.md §2; the paper's values are the defaults)."""

    space: SpaceSpec = "fedavg"  # search space: a preset name, a YAML file, or an inline {server: ..., client: ...}
    wrapper: str = "rs"  # rs (random search) | sha (successive halving)
    configs: int | None = None  # N_c, the configurations started; default 5 (rs) / 27 (sha) (§2.10)
    clients: str = "ball"  # active clients' local vectors: fixed (= beta0) | ball (Delta-ball) | fedex (baseline)
    fedpop_l: bool = True  # FedPop-L: replace the worst local vectors each round (needs clients: ball)
    fedpop_g: bool = True  # FedPop-G: replace the worst configurations every T_g rounds, copying weights
    split: str = "official"  # top / bottom groups: official (ceil(0.3 n), the official code's) | rank (floor(n/rho))
    rho: int = 3  # quantile coefficient of the rank / quantile splits: the best / worst 1/rho are top / bottom
    eps0: float = 0.1  # initial perturbation intensity of Evo (Eq. 3)
    p_re0: float = 0.1  # initial resampling probability of Evo
    g_interval: float = 0.1  # T_g as a share of the rounds (R_c)
    l_window: float = 0.2  # FedPop-L runs for this share of T_g after a configuration's (re)initialisation
    gamma_g: float = 0.9  # power-law decay of FedPop-G's scores (Eq. 5)
    score: str = "powerlaw"  # FedPop-G's / SHA's score: powerlaw (Eq. 5) | avg | last (App. Table 5) | last_weighted
    l_score: str = "discounted"  # FedPop-L's score of a local vector: discounted (0.9, official code) | round
    eta: int = 3  # SHA: keep the best 1/eta at each elimination
    eliminations: int = 3  # SHA: eliminations (27 -> 9 -> 3 -> 1)
    select: str = "val"  # the final configuration: best mean validation accuracy (ours) or test accuracy (paper's RS)
    sampling: str = "shared"  # the active clients: shared by the configurations in a round (ours) | per_member
    l_after: str = "best"  # after FedPop-L's window every active client trains with the best local vector | keep
    g_beta_eps: str = "double"  # FedPop-G's new beta0: Evo with 2 eps0 (official code) | annealed (eps as for alpha)
    fedex_candidates: str = "perturb"  # FedEx's 27: beta0 and Evo perturbations of it, eps0 (official) | space
    fedex_sched: str = "aggressive"  # FedEx's step: eta0 / max|grad| (official default) | auto (eta0 / sqrt(t))
    fedex_baseline: float | None = None  # FedEx's baseline discount: null = drawn U[0, 1) per member (official)
    budget: int | None = None  # R_t, rounds over all configurations: RS checks N_c R_c <= R_t; SHA sizes its stages

    def validate(self) -> None:
        choices_of = ((self.wrapper, WRAPPERS, "wrapper"), (self.clients, CLIENT_VECTORS, "clients"),
                      (self.score, SCORES, "score"), (self.select, SELECTIONS, "select"), (self.split, SPLITS, "split"),
                      (self.l_score, L_SCORES, "l_score"), (self.sampling, SAMPLINGS, "sampling"),
                      (self.l_after, L_AFTER, "l_after"), (self.g_beta_eps, G_BETA_EPS, "g_beta_eps"),
                      (self.fedex_candidates, FEDEX_CANDIDATES, "fedex_candidates"),
                      (self.fedex_sched, FEDEX_SCHEDS, "fedex_sched"))
        for value, choices, what in choices_of:
            if value not in choices:
                raise unknown_choice(f"tune.{what}", value, choices)
        _positive("tune.configs", self.configs, allow_none=True)
        _positive("tune.rho", self.rho, at_least=2)
        _positive("tune.eta", self.eta, at_least=2)
        _positive("tune.eliminations", self.eliminations)
        _positive("tune.budget", self.budget, allow_none=True)
        for name, low_open in (("eps0", False), ("p_re0", False), ("g_interval", True), ("l_window", True),
                               ("gamma_g", True)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    0 < value <= 1 if low_open else 0 <= value <= 1):
                raise ConfigError(f"tune.{name} must be in {'(0, 1]' if low_open else '[0, 1]'}, got {value!r}")
        b = self.fedex_baseline
        if b is not None and (isinstance(b, bool) or not isinstance(b, int | float) or not 0 <= b <= 1):
            raise ConfigError(f"tune.fedex_baseline must be in [0, 1] or null (drawn per member), got {b!r}")
        if self.split == "official" and self.rho != 3:
            raise ConfigError(f"tune.rho={self.rho} sizes the rank and quantile splits; the official split is "
                              "ceil(0.3 n) whatever rho: set tune.split=rank to use rho")
        if self.fedpop_l and self.clients != "ball":
            raise ConfigError(f"tune.fedpop_l evolves the Delta-ball's local vectors; it needs tune.clients=ball "
                              f"(got {self.clients}); set tune.fedpop_l=false for clients={self.clients}")
        if self.clients == "fedex" and self.fedpop_g:
            raise ConfigError("tune.clients=fedex is the FedEx baseline (its own local search); set "
                              "tune.fedpop_g=false with it")
        if self.wrapper == "sha" and self.num_configs < self.eta ** self.eliminations:
            raise ConfigError(f"tune: SHA keeps 1/{self.eta} of the configurations {self.eliminations} times; "
                              f"start at least {self.eta ** self.eliminations} (tune.configs={self.num_configs})")

    @property
    def num_configs(self) -> int:
        """N_c: as set, else the paper's 5 for RS and 27 for SHA (§2.10)."""
        return self.configs if self.configs is not None else (27 if self.wrapper == "sha" else 5)

    def g_rounds(self, rounds: int) -> int:
        """T_g = max(1, round(g_interval * R_c)) (§2.10: 0.1 R_c)."""
        return max(1, round(self.g_interval * rounds))


def _positive(name: str, value: Any, at_least: int = 1, allow_none: bool = False) -> None:  # Any: parsed YAML
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
        raise ConfigError(f"{name} must be an integer >= {at_least}, got {value!r}")


def tune_config(cfg: ExperimentConfig) -> TuneConfig:
    """The experiment's `tune` section, validated, with the checks that need the experiment: a validation split
    to score on, no held-out novel clients, and a method that trains federated (not centralized)."""
    from fedhet.algorithms.registry import ALGORITHMS

    tune = from_dict(TuneConfig, dict(cfg.tune), "tune")
    tune.validate()
    if not cfg.data.val_fraction > 0:
        raise ConfigError("fedhet tune scores configurations on each client's validation split: set "
                          "data.val_fraction (the paper and its code hold out 0.2)")
    if cfg.novel.holdout or cfg.novel.clients:
        raise ConfigError("fedhet tune does not hold out novel clients; unset novel.holdout / novel.clients")
    if ALGORITHMS.get(cfg.method).centralized:
        raise ConfigError(f"method '{cfg.method}' trains on the pooled data, not federated; tune a federated method")
    return tune


def resolve_space(tune: TuneConfig, config_dir: Path | None = None) -> SearchSpace:
    """The search space `tune.space` names: a preset, a YAML file (relative to the config's folder), or a
    mapping."""
    from fedhet.tune.presets import PRESETS

    if isinstance(tune.space, dict):
        return parse_space(tune.space)
    if isinstance(tune.space, str) and tune.space in PRESETS:
        return parse_space({"preset": tune.space})
    if isinstance(tune.space, str) and tune.space.endswith((".yaml", ".yml")):
        path = Path(tune.space)
        return load_space(path if path.is_absolute() or config_dir is None else config_dir / path)
    raise ConfigError(f"tune.space must be a preset ({', '.join(PRESETS)}), a .yaml file or a mapping, got "
                      f"{tune.space!r}")
