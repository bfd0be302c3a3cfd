"""The paper's search spaces (FedPop appendix, spec §2.9) as named presets, in the YAML format of `parse_space`.

Mapping of the paper's hyperparameters to fedhet config keys:

server alpha (Agg, Eq. 2)
  * log10 lr : U[-1, 1]            -> `server.lr` (log_uniform -1..1; server.optimizer=sgd)
  * momentum : U[0, 0.9]           -> `server.momentum` (uniform 0..0.9)
  * log10(1 - gamma) : U[-4, -2]   -> `server.lr_decay` (one_minus_log -4..-2: the server lr decays per round)
client beta (Loc, Eq. 1)
  * log10 lr : U[-4, 0]            -> `train.lr`
  * momentum : U[0, 1.0]           -> `train.momentum`, uniform 0..0.99: fedhet requires momentum < 1
  * log10 weight decay : U[-5, -1] -> `train.weight_decay`
  * epoch : U{1..5}                -> `train.local_epochs` (int 1..5; train.local_steps must be unset)
  * log2 batch : U{3..7}           -> `train.batch_size` (log2_int 3..7, i.e. 8..128)
  * dropout : U[0, 0.5]            -> no train key: dropout is a model constructor argument (`model.args.dropout`
    of small_cnn / mlp / efficientnet_lite0), so it is left out; add it in your space for a model that takes it
  * scheduler (distribution not stated in the paper) -> no fedhet key (left out)
FedProx: proximal strength U[0, 1.0] -> `method_args.mu` (uniform 0..1)
SCAFFOLD: log10 lr_control U[-1, 1], log10(1 - gamma_control) U[-4, -2] -> `method_args.control_lr` and
  `method_args.control_decay` (the step size of SCAFFOLD's control-variate update and its per-round decay).

The `*_official` presets follow the samplers of the public FedEx code (Khodak et al. 2021) that FedPop builds on:
server momentum is a choice {0, 0.9} (Evo then flips it or keeps it) and log10 mu ~ U[-5, 0] (Evo steps of
+-5 eps in log10). With these ranges, Eq. 3 at scale 1 gives the official step sizes: client lr and weight decay
+-4 eps, mu +-5 eps, client momentum +-eps, dropout +-0.5 eps, server lr and gamma +-2 eps (in log10 where
log-scaled), so every preset dimension has scale 1.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from fedhet.errors import unknown_choice
from fedhet.yaml_input import JSONDict

if TYPE_CHECKING:
    from fedhet.tune.space import SearchSpace

_SERVER: JSONDict = {
    "server.lr": {"type": "log_uniform", "low": -1, "high": 1},
    "server.momentum": {"type": "uniform", "low": 0.0, "high": 0.9},
    "server.lr_decay": {"type": "one_minus_log", "low": -4, "high": -2},
}
_CLIENT: JSONDict = {
    "train.lr": {"type": "log_uniform", "low": -4, "high": 0},
    "train.momentum": {"type": "uniform", "low": 0.0, "high": 0.99},
    "train.weight_decay": {"type": "log_uniform", "low": -5, "high": -1},
    "train.local_epochs": {"type": "int", "low": 1, "high": 5},
    "train.batch_size": {"type": "log2_int", "low": 3, "high": 7},
}
_MU_PAPER = {"type": "uniform", "low": 0.0, "high": 1.0}
_MU_OFFICIAL = {"type": "log_uniform", "low": -5, "high": 0}
_SERVER_OFFICIAL = {**_SERVER, "server.momentum": {"type": "choice", "values": [0.0, 0.9]}}

PRESETS: dict[str, JSONDict] = {
    "fedavg": {"server": _SERVER, "client": _CLIENT},
    "fedprox": {"server": _SERVER, "client": {**_CLIENT, "method_args.mu": _MU_PAPER}},
    "scaffold": {"server": {**_SERVER, "method_args.control_lr": {"type": "log_uniform", "low": -1, "high": 1},
                            "method_args.control_decay": {"type": "one_minus_log", "low": -4, "high": -2}},
                 "client": _CLIENT},
    "fedavg_official": {"server": _SERVER_OFFICIAL, "client": _CLIENT},
    "fedprox_official": {"server": _SERVER_OFFICIAL, "client": {**_CLIENT, "method_args.mu": _MU_OFFICIAL}},
}


def preset_tree(name: str) -> JSONDict:
    """A fresh copy of preset `name` as a {server: {...}, client: {...}} mapping (ConfigError if unknown)."""
    if name not in PRESETS:
        raise unknown_choice("search-space preset", name, PRESETS)
    return copy.deepcopy(PRESETS[name])


def preset(name: str) -> SearchSpace:
    """The SearchSpace of preset `name` (fedavg, fedprox, scaffold, fedavg_official, fedprox_official)."""
    from fedhet.tune.space import parse_space

    return parse_space({"preset": name})
