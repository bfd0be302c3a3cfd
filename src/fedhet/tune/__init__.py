"""Population-based hyperparameter tuning (FedPop, spec fedpop.md): typed search spaces and the Evo operator.

`space` reads search spaces (dotted config keys -> typed dimensions), `presets` holds the paper's spaces,
`apply` checks a space against an experiment config and turns HP vectors into run configs, `evo` perturbs,
resamples, anneals and samples the Delta-ball, `fedpop` holds FedPop-L / -G's decision rules. See docs/tune.md.
"""

from fedhet.tune.apply import (
    apply_vector,
    check_space,
    hparams_of,
    to_overrides,
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
from fedhet.tune.fedpop import (
    GAMMA_G,
    RHO,
    Replacement,
    Tried,
    fedpop_g,
    fedpop_l,
    g_interval,
    is_g_round,
    l_window_open,
    member_score,
    split_quantiles,
)
from fedhet.tune.keys import tunable_keys
from fedhet.tune.presets import PRESETS, preset
from fedhet.tune.space import KINDS, Dim, HPVector, SearchSpace, Space, load_space, parse_dim, parse_space

__all__ = [
    "BALL_RADIUS",
    "EPS0",
    "GAMMA_G",
    "KINDS",
    "P_RE0",
    "PRESETS",
    "RHO",
    "Dim",
    "EvoOptions",
    "HPVector",
    "Replacement",
    "SearchSpace",
    "Space",
    "Tried",
    "anneal",
    "apply_vector",
    "check_space",
    "hparams_of",
    "delta",
    "delta_ball",
    "discrete_step",
    "evo",
    "fedpop_g",
    "fedpop_l",
    "g_interval",
    "is_g_round",
    "l_window_open",
    "load_space",
    "member_score",
    "parse_dim",
    "parse_space",
    "perturb",
    "preset",
    "project_to_ball",
    "split_quantiles",
    "to_overrides",
    "tunable_keys",
    "vector_from_dict",
    "vector_to_dict",
]
