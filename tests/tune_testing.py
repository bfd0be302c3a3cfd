"""Helpers for the tuner's tests: the small FedPop setting most of them start from and a population played for
all its rounds (import as `from tune_testing import ...`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedhet.tune.population import Population

# offline digits, an MLP, 3 configurations of 4 rounds with T_g = 2, half the clients a round, a 3-value space
BASE = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "train.local_steps=2",
        "rounds=4", "run.num_threads=1", "run.quiet=true", "server.fraction_fit=0.5", "eval.every=2",
        "tune.configs=3", "tune.g_interval=0.5",
        "tune.space={client: {train.lr: {type: log_uniform, low: -2, high: -0.5}, "
        "train.batch_size: {type: choice, values: [8, 16]}}, server: {server.lr: {type: log_uniform, low: -0.3, "
        "high: 0.3}}}"]


def played(*extra: str, base: tuple[str, ...] | list[str] = tuple(BASE)) -> Population:
    """The `Population` of the config `base` + `extra`, played for all its rounds."""
    from fedhet.config import load_config
    from fedhet.engine.experiment import build_experiment
    from fedhet.tune.config import resolve_space, tune_config
    from fedhet.tune.population import Population

    cfg = load_config(None, [*base, *extra])
    tune = tune_config(cfg)
    pop = Population(build_experiment(cfg), tune, resolve_space(tune))
    pop.start()
    for rnd in range(1, cfg.rounds + 1):
        pop.play_round(rnd)
    return pop
