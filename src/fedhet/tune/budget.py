"""The `sweep.tune` block of a tuned sweep (tune/sweep.py) and its budget in client-rounds: live members x active
clients, summed over the tuning rounds. `8x` is 8 full runs' worth (8 x rounds x active clients per round);
a bare integer is client-rounds. Each tuner is sized to spend at most the budget: random search (rs, fedpop) starts
budget // (rounds x clients) configurations; SHA its eliminations (tune.eliminations, fewer if they do not fit) of
the fewest configurations whose equal stages fit the budget."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fedhet.config import ExperimentConfig
from fedhet.errors import ConfigError, nearest, unknown_choice
from fedhet.tune.presets import TUNERS
from fedhet.yaml_input import JSONDict

BLOCK_KEYS = ("budget", "tuners", "seed", "seeds", "space", "lanes")
DEFAULT_TUNE_SEED = 1000
DEFAULT_SEEDS = (0, 1, 2)
EXAMPLE = "{budget: 8x, tuners: [rs], seed: 1000, seeds: [0, 1, 2]}"


@dataclass(frozen=True)
class TuneBlock:
    """A tuned sweep's settings: budget, tuners, the tuning seed, the fresh seeds, the search space (None: each
    method's default)."""

    budget: str
    tuners: list[str]
    seed: int
    seeds: list[int]
    space: str | JSONDict | None
    lanes: bool = False  # tuning jobs as population lanes (run.runtime=batched) where the rule allows


def tune_block(cfg: ExperimentConfig, budget: str | None = None, seeds: list[int] | None = None) -> TuneBlock:
    """`sweep.tune` checked, with the CLI's --tune budget and --seeds in place of the block's (fresh seeds:
    --seeds, else sweep.tune.seeds, else 0, 1, 2: a comparison reports 3 fresh seeds unless told otherwise, even
    when the plain sweep runs one seed)."""
    raw = cfg.sweep.get("tune") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep.tune must be a mapping such as {EXAMPLE}, got {raw!r}")
    for key in raw:
        if key not in BLOCK_KEYS:
            raise ConfigError(f"unknown sweep.tune key '{key}'{nearest(str(key), BLOCK_KEYS)}; valid: "
                              f"{', '.join(BLOCK_KEYS)}")
    budget = budget if budget is not None else raw.get("budget")
    if budget is None:
        raise ConfigError("a tuned sweep needs a budget: --tune 8x (8 full runs' worth per method and tuner), "
                          "--tune 4000 (client-rounds), or sweep.tune.budget")
    tuners = raw.get("tuners") or ["rs"]
    tuners = [tuners] if isinstance(tuners, str) else tuners
    if not isinstance(tuners, list) or len(set(map(str, tuners))) != len(tuners):
        raise ConfigError(f"sweep.tune.tuners must list tuners ({', '.join(TUNERS)}) once each, got {tuners!r}")
    for tuner in tuners:
        if tuner not in TUNERS:
            raise unknown_choice("tuner (sweep.tune.tuners)", str(tuner), TUNERS)
    fresh = seeds if seeds is not None else raw.get("seeds") or list(DEFAULT_SEEDS)
    seed = raw.get("seed", DEFAULT_TUNE_SEED)
    if not isinstance(fresh, list) or not all(_seed(s) for s in fresh) or not _seed(seed):
        raise ConfigError(f"sweep.tune.seed must be an integer >= 0 and seeds a list of them, got {seed!r}, {fresh!r}")
    if seed in fresh:
        raise ConfigError(f"the tuning seed {seed} is among the fresh seeds {fresh}: the chosen configuration must be "
                          "re-run on seeds it was not tuned on; set sweep.tune.seed to another (e.g. 1000) or drop "
                          f"{seed} from the seeds. Nothing was run.")
    lanes = raw.get("lanes", False)
    if not isinstance(lanes, bool):
        raise ConfigError(f"sweep.tune.lanes must be true or false, got {lanes!r}")
    return TuneBlock(str(budget), list(tuners), seed, list(fresh), raw.get("space"), lanes)


def _seed(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def client_rounds(budget: str, full_run: int) -> int:
    """The budget in client-rounds: `NUMx` (NUM full runs of `full_run` client-rounds each) or an integer."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)x|(\d+))\s*", budget)
    if match is None:
        raise ConfigError(f"tune budget '{budget}': give full runs' worth as NUMx (8x: 8 x rounds x active clients "
                          "per round) or client-rounds as an integer (4000)")
    return int(float(match[1]) * full_run) if match[1] else int(match[2])


def train_clients(cfg: ExperimentConfig) -> int:
    """The clients the config's data splits into (data.num_clients, or domains x clients_per_domain), counted
    without loading it."""
    from fedhet.data.registry import resolve_spec

    data = cfg.data
    if data.partition == "domain":
        return len(data.domains or resolve_spec(data).domains) * data.clients_per_domain
    return data.num_clients


def clients_per_round(cfg: ExperimentConfig) -> int:
    """The active clients of a round: every client, or server.fraction_fit of them (at least min_fit_clients)."""
    from fedhet.engine.sampling import sample_size

    return sample_size(train_clients(cfg), cfg.server.fraction_fit, cfg.server.min_fit_clients)


def tuner_size(settings: JSONDict, rounds: int, budget: int) -> JSONDict:
    """tune.configs and tune.budget (R_t, member-rounds; SHA: and tune.eliminations) that spend at most `budget`
    member-rounds with `rounds` rounds per configuration."""
    if settings.get("wrapper") == "sha":
        eta = int(settings.get("eta", 3))
        shape = sha_shape(rounds, budget, eta, int(settings.get("eliminations", 3)))
        if shape is None:
            raise ConfigError(f"tuner sha cannot fit a budget of {budget} member-rounds at rounds={rounds}: it "
                              f"starts at least {eta} configurations, each stage before an elimination lasts at "
                              "least one round and the survivor trains all the rounds (rounds >= 2); raise the "
                              "budget or the rounds, or tune with rs. Nothing was run.")
        return {"eliminations": shape[0], "configs": shape[1], "budget": budget}
    return {"configs": budget // rounds, "budget": budget // rounds * rounds}


def sha_shape(rounds: int, budget: int, eta: int, eliminations: int = 3) -> tuple[int, int] | None:
    """(E, N): `eliminations` (else fewer) of the fewest configurations N >= eta^E whose equal stages fit `budget`
    member-rounds (tune.wrappers.sha_rounds: the survivor's rounds plus the eliminated ones'); N < eta^(E+1), so
    one configuration survives and the spend stays within the budget. The paper's 27 -> 9 -> 3 -> 1 when it fits;
    None if nothing does."""
    from fedhet.tune.wrappers import sha_rounds

    for stages in range(eliminations, 0, -1):
        for configs in range(eta ** stages, eta ** (stages + 1)):
            try:
                sha_rounds(rounds, stages, configs, eta, budget)
            except ConfigError:
                continue
            return stages, configs
    return None
