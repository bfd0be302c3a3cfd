"""Build an experiment from a config: data, model factory and algorithm, ready for any runtime."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from threadpoolctl import threadpool_limits

from fedhet.algorithms import ALGORITHMS
from fedhet.algorithms.base import AnyAlgorithm
from fedhet.config import ExperimentConfig, from_dict
from fedhet.core.contract import ClientContext, RoundInfo, ServerState
from fedhet.core.seeding import seeded
from fedhet.data import ClientData, FederatedData, build_federated_data
from fedhet.errors import ConfigError
from fedhet.models import SplitModel, build_model
from fedhet.models.vl_pretrain import load_backbone

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("run.device is 'cuda' but no CUDA device is available; use run.device=cpu or auto")
    return torch.device(name)


@dataclass(frozen=True)
class Arrangement:
    """Who trains: `train`, the training clients (the clients themselves, or for a centralized method one
    pseudo-client "all" holding the union of their training data), and `state_of[cid]`, the training client
    whose state client `cid` deploys at evaluation. `pooled`: one model trained on everyone's data, which has
    no federated counterpart (the Flower runtime refuses it)."""

    train: list[ClientData]
    state_of: list[int]
    pooled: bool = False
    novel: tuple[int, ...] = ()  # held-out clients (engine/novel.py): never sampled, adapted after training

    def pool(self, n: int) -> list[int]:
        """The ids among the first `n` training clients that may be sampled (all but the held-out ones)."""
        return [c for c in range(n) if c not in self.novel]


def arrange(alg: AnyAlgorithm, data: FederatedData, novel: list[int] | None = None) -> Arrangement:
    """The clients as they train: as they are, or pooled for a centralized method (the oracle `all`); `novel`:
    the held-out clients."""
    if not alg.centralized:
        return Arrangement(list(data.clients), list(range(len(data.clients))), novel=tuple(novel or ()))
    if novel:
        raise ConfigError(f"novel clients cannot be held out of {alg.name}: it pools every client's data; set "
                          "novel.holdout=0")
    pooled = ClientData(name="all", domain="all", train=data.pooled_train(), val=None, test=data.pooled_test(),
                        train_eval=data.pooled_train())
    return Arrangement([pooled], [0] * len(data.clients), pooled=True)


@dataclass
class Experiment:
    """Everything a runtime needs: config, data (and how it is arranged for training), device and algorithm."""

    config: ExperimentConfig
    data: FederatedData
    device: torch.device
    algorithm: AnyAlgorithm
    model_fn: Callable[[], SplitModel]
    arrangement: Arrangement

    def init_server(self, algorithm: AnyAlgorithm | None = None) -> ServerState:
        """The algorithm's (or a tuning member's copy `algorithm`'s) initial server state, drawn from the run's
        seed (every runtime starts from it)."""
        with seeded(self.config.seed, "server-init"):
            server: ServerState = (self.algorithm if algorithm is None else algorithm).init_server()
        return server

    def round_info(self, rnd: int) -> RoundInfo:
        """Round `rnd` of this run, as the algorithm sees it."""
        return RoundInfo(round=rnd, rounds=self.config.rounds, num_clients=len(self.data.clients),
                         seed=self.config.seed)

    def context(self, client_id: int, rnd: int, data: ClientData | None = None) -> ClientContext:
        """What client `client_id` knows in round `rnd` (its own data unless `data` is given)."""
        return ClientContext(client_id=client_id, info=self.round_info(rnd),
                             data=data if data is not None else self.data.clients[client_id],
                             device=self.device, num_classes=self.data.num_classes,
                             class_names=tuple(self.data.classes))


def make_model_fn(cfg: ExperimentConfig, data: FederatedData) -> Callable[[], SplitModel]:
    """A factory for the initial model; seeded, so every call (and every process) builds the same weights."""

    def model_fn() -> SplitModel:
        with seeded(cfg.seed, "model-init"):
            model = build_model(cfg.model.name, data.num_classes, data.input_shape,
                                pretrained=cfg.model.pretrained, vocabulary=data.vocabulary, **cfg.model.args)
        if cfg.model.init_from:  # transfer: the pretrained features, a fresh head for this data's classes
            load_backbone(model, cfg.model.init_from, head=False)
        return model

    return model_fn


def build_algorithm(cfg: ExperimentConfig, data: FederatedData, device: torch.device,
                    model_fn: Callable[[], SplitModel]) -> AnyAlgorithm:
    """Instantiate the configured method with its validated `method_args`."""
    return ALGORITHMS.get(cfg.method)(method_params(cfg), model_fn, cfg.train, cfg.server, data.num_classes, device,
                                      num_clients=len(data.clients))


def method_params(cfg: ExperimentConfig) -> Any:  # Any: the method's own Params dataclass
    """The method's `Params` built from `cfg.method_args` and validated (unknown keys / bad values: ConfigError)."""
    params: Any = from_dict(  # Any: as above
        ALGORITHMS.get(cfg.method).Params, cfg.method_args, "method_args")
    if hasattr(params, "validate"):
        params.validate()
    return params


def limit_threads(n: int) -> threadpool_limits:
    """torch's intra-op threads AND the BLAS pools numpy / scipy load (OpenBLAS / MKL) to `n`. A BLAS pool left at
    the core count wakes sleeping threads on every small LAPACK call; on a loaded machine that costs milliseconds
    per call (measured: a 19 x 19 triangular solve of the MK-MMD beta QP took 7 ms instead of 0.02 ms).
    Returns the BLAS limit, whose `restore_original_limits()` undoes it (torch's count is not restored)."""
    torch.set_num_threads(n)
    return threadpool_limits(limits=n, user_api="blas")


def build_experiment(cfg: ExperimentConfig) -> Experiment:
    """Check names first (cheap), then load data, then build the model and algorithm."""
    method = ALGORITHMS.get(cfg.method)  # unknown method -> error before any data is loaded
    if method.one_shot and cfg.rounds != 1:
        raise ConfigError(f"method '{cfg.method}' is one-shot (one upload per client, then the server step): set "
                          f"rounds=1, got rounds={cfg.rounds}")
    if cfg.run.num_threads:
        limit_threads(cfg.run.num_threads)
    device = resolve_device(cfg.run.device)
    data = build_federated_data(cfg.data, cfg.seed)
    model_fn = make_model_fn(cfg, data)
    algorithm = build_algorithm(cfg, data, device, model_fn)
    log.info("built %s on %s: %d clients, %d classes, device %s", cfg.method, cfg.data.dataset,
             len(data.clients), data.num_classes, device)
    if len(data.clients) < 2 and not method.centralized:
        log.warning("the data gives %d client (%s), so this 'federation' of %s is local training on one client's "
                    "data; give more domains (one folder / client value each) or split the pool with "
                    "data.partition=iid (or dirichlet) data.num_clients=K", len(data.clients),
                    ", ".join(c.name for c in data.clients) or "none", cfg.method)
    from fedhet.engine.novel import held_out

    novel = held_out(cfg.novel, [c.name for c in data.clients], cfg.seed)
    return Experiment(cfg, data, device, algorithm, model_fn, arrange(algorithm, data, novel))
