"""Population-based hyperparameter tuning (FedPop, spec fedpop.md): typed search spaces and the Evo operator.

`space` reads search spaces (dotted config keys -> typed dimensions), `presets` holds the paper's spaces,
`apply` checks a space against an experiment config and turns HP vectors into run configs, `evo` perturbs,
resamples, anneals and samples the Delta-ball. See docs/tune.md.
"""

from fedhet.tune.apply import (
    apply_vector,
    check_space,
    hparams_of,
    to_overrides,
    tunable_keys,
    vector_from_dict,
    vector_to_dict,
)
from fedhet.tune.evo import (
    BALL_RADIUS,
    EPS0,
    P_RE0,
    EvoOptions,
    anneal,
    delta,
    delta_ball,
    discrete_step,
    evo,
    perturb,
    project_to_ball,
)
from fedhet.tune.presets import PRESETS, preset
from fedhet.tune.space import KINDS, Dim, HPVector, SearchSpace, Space, load_space, parse_dim, parse_space

__all__ = [
    "BALL_RADIUS",
    "EPS0",
    "KINDS",
    "P_RE0",
    "PRESETS",
    "Dim",
    "EvoOptions",
    "HPVector",
    "SearchSpace",
    "Space",
    "anneal",
    "apply_vector",
    "check_space",
    "hparams_of",
    "delta",
    "delta_ball",
    "discrete_step",
    "evo",
    "load_space",
    "parse_dim",
    "parse_space",
    "perturb",
    "preset",
    "project_to_ball",
    "to_overrides",
    "tunable_keys",
    "vector_from_dict",
    "vector_to_dict",
]
