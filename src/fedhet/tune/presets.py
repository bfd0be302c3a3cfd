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

`default_space(method)`: a method's default search space (its client lr and its own hyperparameters, each range's
source beside it), what a tuned sweep searches when the user names none; `tuner_settings(name)`: the `tune`
section of the sweep's tuners rs, sha and fedpop.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from fedhet.errors import ConfigError, unknown_choice
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


# The tuners a tuned sweep names (docs/tune.md "Tuned sweeps"): `tune` section overrides. rs and sha train every
# client of a configuration with its own beta^0 (each configuration is one plain run); fedpop is the paper's
# FedPop (FedPop-L and -G, the Delta-ball) inside random search.
TUNERS: dict[str, JSONDict] = {
    "rs": {"wrapper": "rs", "clients": "fixed", "fedpop_l": False, "fedpop_g": False},
    "sha": {"wrapper": "sha", "clients": "fixed", "fedpop_l": False, "fedpop_g": False},
    "fedpop": {"wrapper": "rs", "clients": "ball", "fedpop_l": True, "fedpop_g": True},
}


def tuner_settings(name: str) -> JSONDict:
    """The `tune` section overrides of tuner `name` (rs, sha, fedpop); ConfigError naming the valid ones."""
    if name not in TUNERS:
        raise unknown_choice("tuner", name, TUNERS)
    return copy.deepcopy(TUNERS[name])


def _log(low: float, high: float) -> JSONDict:
    return {"type": "log_uniform", "low": low, "high": high}


# The client lr of every SGD-trained method: the FedPop paper's log10 lr U[-4, 0] (spec fedpop.md §2.9) narrowed
# to 1e-3 .. 0.3, around the 0.01 of FRAug's appendix Table 2, AdaptFED's spec §2.10 and Ditto-MMD's configs and
# the quickstart's 0.1: below 1e-3 SGD hardly moves in the rounds of a comparison, near 1 it diverges.
LR_SGD = _log(-3, -0.5)
# AdamW on a frozen backbone (FedDAT and its PEFT baselines): the paper's 1e-4 (spec feddat.md, App. B.2) to 1e-2,
# the grid {3e-4, 1e-3, 3e-3, 1e-2} the easy-VQA stand-in chose 3e-3 from (configs/feddat/common.yaml).
LR_ADAMW = _log(-4, -2)

# Each method's own hyperparameters (key -> dimension) beyond its client lr; the source of each range is on its
# line. A method not listed is tuned on its client lr alone. `default_space` puts a key the method reads per call
# (`capabilities.call_params`) under client: and one it reads when it is built under server: (one per member).
METHOD_DIMS: dict[str, JSONDict] = {
    "adaptfed": {
        # the hypernetwork's VJP step: FedTP's 0.01 (spec adaptfed.md §2.10) up to the 0.1 / 0.3 of
        # configs/adaptfed/variants.yaml and down to 1e-3 (lr_for(R) then scales it by sqrt(1500 / R))
        "method_args.update.lr": _log(-3, -0.5),
        # the client embedding: 32 in the paper's novel-client experiment (spec §2.10), 8 .. 64 around it
        "method_args.embedding_dim": {"type": "log2_int", "low": 3, "high": 6}},
    "fraug": {
        # lambda_G (L_G_dist_lambda) and lambda_FT (L_FT_dist_lambda): the official grid {0.1, 1, 10} (main.py:91)
        # and the appendix's 1 .. 1.5 (spec fraug.md, Table 2); PACS uses 10 for lambda_G
        "method_args.alpha": _log(-1, 1),
        "method_args.beta": _log(-1, 1),
        # the generator's lr eta_g: the appendix's 0.005 (Digits) .. 0.05 (PACS, OfficeHome), main.py's {0.025, 0.05}
        "method_args.eta_g": _log(-2.5, -1)},
    "feddat": {
        # the MKD weights alpha = beta: 1 (official code) or the paper's exp ramp-up (App. B.2); neither gives
        # another value (spec feddat.md §2.4)
        "method_args.ramp": {"type": "choice", "values": ["constant", "exp"]},
        # the KL temperature: the paper's (unstated, read as) 1 and the official code's 3 (tt 506-516), 1 .. 10
        "method_args.temperature": _log(0, 1)},
    # lambda and mu: FL4Health's grids {0.01, 0.1, 1.0} (spec ditto_mmd.md, hyperparameter table)
    "ditto_mmd": {"method_args.lam": _log(-2, 0), "method_args.mu": _log(-2, 0)},
    "ditto": {"method_args.lam": _log(-2, 0)},  # the same lambda grid
    # mu: the FedProx paper's grid {0.001, 0.01, 0.1, 1} (Li et al. 2020, Sec. 5.3)
    "fedprox": {"method_args.mu": _log(-3, 0)},
    "feddyn": {"method_args.alpha": _log(-3, -1)},  # the FedDyn paper's search {0.001, 0.01, 0.1}
    # MOON's mu: the paper's 1 (CIFAR-100, Tiny-ImageNet) and 5 (CIFAR-10), searched over {0.1, 1, 5, 10}
    "moon": {"method_args.mu": _log(-1, 1)},
    "fedproto": {"method_args.lam": _log(-1, 1)},  # lambda: fedhet's default 1 (the paper gives none), 0.1 .. 10
    # the noise scale gamma of FRAug's Table 7 baselines (searched there, values not given): 0.01 .. 1 around 0.1
    "embnoise": {"method_args.gamma": _log(-2, 0)},
    "fed_sfda": {"method_args.lambda_kd": _log(-1, 1)},  # lambda_KD: 1 (docs/fed_sfda.md), 0.1 .. 10
}
ADAMW_METHODS = ("feddat", "peft")


def default_space(method: str) -> JSONDict:
    """Method `method`'s default search space as a {server: {...}, client: {...}} tree (the format of
    `parse_space`): its client lr and its own hyperparameters (`METHOD_DIMS`; docs/tune.md "Default search
    spaces"). ConfigError for an unknown method or one that does not train federated over rounds."""
    from fedhet.algorithms.registry import ALGORITHMS

    if method not in ALGORITHMS:
        raise unknown_choice("method", method, ALGORITHMS.names())
    alg = ALGORITHMS.get(method)
    if alg.centralized or alg.one_shot:
        raise ConfigError(f"method '{method}' {'trains on the pooled data' if alg.centralized else 'is one-shot'}"
                          "; a default search space is for methods that train federated over rounds")
    lr = LR_ADAMW if method in ADAMW_METHODS else LR_SGD
    tree: JSONDict = {"server": {}, "client": {"train.lr": dict(lr)}}
    for key, dim in METHOD_DIMS.get(method, {}).items():
        per_call = key.partition(".")[2] in alg.capabilities.call_params  # as tune/keys.py build_time
        tree["client" if per_call else "server"][key] = copy.deepcopy(dim)
    return tree
