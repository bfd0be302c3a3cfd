"""privacy.dp in a run: the checks before it trains and its ledger (core/dp.py, core/dp_accountant.py)."""

from __future__ import annotations

from fedhet.algorithms.base import own_aggregate
from fedhet.core.contract import ServerState
from fedhet.core.dp import dp_steps
from fedhet.core.dp_accountant import PrivacyLedger
from fedhet.engine.experiment import Experiment
from fedhet.engine.sampling import sample_size
from fedhet.errors import ConfigError


def open_ledger(exp: Experiment, num_train_clients: int) -> PrivacyLedger | None:
    """The run's privacy ledger (None without privacy.dp), after refusing a method that aggregates in its own way:
    DP-FedAvg clips and noises the shared model's mean, which such a method does not compute."""
    cfg = exp.config
    if not cfg.privacy.dp.active:
        return None
    if own_aggregate(exp.algorithm):
        raise ConfigError(f"method '{cfg.method}' aggregates in its own way, not through the shared model average, "
                          "so privacy.dp (DP-FedAvg: clipped updates, noised mean) cannot apply to it; DP applies to "
                          "methods that average their shared model (fedavg, fedprox, fedbn, ditto, fedrep, ...); "
                          "set privacy.dp.mode=off")
    pool = len(exp.arrangement.pool(num_train_clients))
    return PrivacyLedger.for_run(cfg.privacy.dp, pool,
                                 sample_size(pool, cfg.server.fraction_fit, cfg.server.min_fit_clients))


def refusal(ledger: PrivacyLedger | None, server: ServerState) -> str | None:
    """Why privacy.dp.max_epsilon refuses the round after `server`'s (None: it may train)."""
    return None if ledger is None else ledger.refusal(dp_steps(server))
