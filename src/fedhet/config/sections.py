"""The config sections below the top level (`data`, `model`, `train`, `server`, `eval`, `run`): each a dataclass
with defaults and a `validate()` that rejects bad values with a ConfigError before any training starts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fedhet.errors import ConfigError, nearest
from fedhet.yaml_input import JSONDict

LOCAL_OPTIMIZERS = ("sgd", "adam", "adamw")
RUNTIMES = ("inprocess", "batched", "flower", "flower-simulation")
LOGGERS = ("csv", "tensorboard", "mlflow", "wandb")  # run.loggers (engine/tracking.py)
AVERAGING_RULES = ("weighted", "uniform")  # server.aggregation: the mean, by sample count or equal
# server.aggregation's robust rules (core/robust.py, docs/robust.md); those that need an honest majority
ROBUST_RULES = ("median", "trimmed_mean", "krum", "multi_krum", "norm_bound", "geometric_median")
MAJORITY_RULES = ("median", "trimmed_mean", "krum", "multi_krum", "geometric_median")
AGGREGATIONS = AVERAGING_RULES + ROBUST_RULES


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass
class DataConfig:
    """Which data, how it is split into clients, and how each client's data is split and transformed."""

    dataset: str = "offline_digits"
    root: str | None = None  # data root; default: $FEDHET_DATA
    domains: list[str] | None = None  # subset of the dataset's domains (default: all)
    partition: str = "domain"  # domain | dirichlet | pathological | pathological_uniform | pachinko | quantity | iid
    clients_per_domain: int = 1  # `domain` partition: split each domain IID into this many clients
    num_clients: int = 4  # label-skew / iid / quantity partitions
    alpha: float = 0.5  # Dirichlet concentration for label skew
    classes_per_client: int = 2  # pathological partition
    quantity_alpha: float = 1.0  # Dirichlet concentration over client sizes (quantity skew)
    # pathological_uniform (pFedHN / FedTP; AdaptFED's "pathological"): classes_per_client classes per client, class
    # c's share for its holder i is a_ic / sum_j a_jc with a_ic ~ U(pathological_low, pathological_high)
    pathological_low: float = 0.4
    pathological_high: float = 0.6  # upper end of U(low, high) (pathological_uniform)
    pachinko_alpha: float = 0.4  # pachinko: per-client coarse-group weights ~ Dir(pachinko_alpha)
    pachinko_beta: float = 10.0  # pachinko: per-client fine weights within a coarse group ~ Dir(pachinko_beta)
    # pachinko: class id -> coarse group id (one entry per class, in class-id order), or a built-in table name
    # (cifar100); null: the dataset's own table, if it has one
    coarse_labels: list[int] | str | None = None
    fraction: float = 1.0  # fraction of each client's training data kept (FRAug: 0.1, Digits 0.01)
    min_train_per_client: int = 0  # lower bound on kept training samples after `fraction`
    max_train_per_client: int | None = None  # cap on kept training samples per client (stratified)
    val_fraction: float = 0.0  # share of each client's training pool held out for validation
    test_fraction: float = 0.2  # share held out for test when the dataset has no official test split
    max_test_per_client: int | None = None  # cap on each client's test split (None: all)
    image_size: int | None = None  # resize side; None: the dataset's default
    augment: bool = True  # train-time augmentation (FRAug appendix, Table 1)
    input_noise_std: float = 0.0  # Gaussian noise added to training inputs (FRAug Table 6)
    download: bool = False  # allow downloads (torchvision / HF hub) when a dataset is missing
    options: JSONDict = field(default_factory=dict)  # dataset-specific settings (imagefolder, csv)
    # Digits only, default None (each source's official train/test split). Set: FedBN's protocol for every seed,
    # i.e. each domain's train+test pooled and split 80/20 stratified once, and int(743.8 * 10 * p) training
    # images per domain (FedBN's `--percent`: 0.1 -> 743, 0.01 -> 74; FRAug's Digits uses 0.01).
    fedbn_percent: float | None = None
    # heart_disease only, default "flamby": FLamby's Fed-Heart-Disease (740 complete rows, slope/ca/thal dropped,
    # cp/restecg one-hot, one fixed 66/34 split per hospital for every seed; test_fraction unused);
    # "uci13": all 920 rows and 13 columns, mean-imputed, split per seed with test_fraction.
    heart_preprocessing: str = "flamby"
    # feature datasets only, default None: the dataset's own normaliser (office_caltech10_surf: log_l2,
    # heart_disease: impute_standardize). log_l2 | l1_zscore (per-sample L1, then per-feature z-score fitted on
    # the client's training split, i.e. per domain) | impute_standardize | none.
    feature_norm: str | None = None

    def validate(self) -> None:
        _check(0.0 < self.fraction <= 1.0, f"data.fraction must be in (0, 1], got {self.fraction}")
        _check(self.alpha > 0, f"data.alpha must be > 0, got {self.alpha}")
        _check(self.quantity_alpha > 0, f"data.quantity_alpha must be > 0, got {self.quantity_alpha}")
        _check(0 < self.pathological_low <= self.pathological_high,
               "need 0 < data.pathological_low <= data.pathological_high, got "
               f"{self.pathological_low}, {self.pathological_high}")
        _check(self.pachinko_alpha > 0, f"data.pachinko_alpha must be > 0, got {self.pachinko_alpha}")
        _check(self.pachinko_beta > 0, f"data.pachinko_beta must be > 0, got {self.pachinko_beta}")
        _check(not isinstance(self.coarse_labels, list) or (len(self.coarse_labels) > 0 and
                                                           min(self.coarse_labels) >= 0),
               "data.coarse_labels must list one coarse-group id >= 0 per class")
        _check(self.clients_per_domain >= 1, "data.clients_per_domain must be >= 1")
        _check(self.max_train_per_client is None or self.max_train_per_client >= 1,
               "data.max_train_per_client must be >= 1")
        _check(self.num_clients >= 1, "data.num_clients must be >= 1")
        _check(self.classes_per_client >= 1, "data.classes_per_client must be >= 1")
        _check(0.0 <= self.val_fraction < 1.0, f"data.val_fraction must be in [0, 1), got {self.val_fraction}")
        _check(0.0 < self.test_fraction < 1.0, f"data.test_fraction must be in (0, 1), got {self.test_fraction}")
        _check(self.input_noise_std >= 0, "data.input_noise_std must be >= 0")
        _check(self.image_size is None or self.image_size >= 8, "data.image_size must be >= 8")

    def resolved_root(self) -> Path | None:
        """The data root: `root` if set, else $FEDHET_DATA, else None (only built-in data is available)."""
        root = self.root or os.environ.get("FEDHET_DATA")
        return Path(root).expanduser() if root else None


@dataclass
class ModelConfig:
    """The network: a registry name plus constructor arguments."""

    name: str = "small_cnn"
    args: JSONDict = field(default_factory=dict)
    pretrained: bool = False
    # a `fedhet pretrain` file or a plain state_dict (any model): the features start from it, the head stays fresh
    init_from: str | None = None


@dataclass
class TrainConfig:
    """Local training on each client."""

    local_epochs: int = 1
    local_steps: int | None = None  # if set, overrides local_epochs: this many mini-batches per round
    batch_size: int = 32
    optimizer: str = "sgd"  # sgd | adam | adamw (decoupled weight decay, Loshchilov & Hutter)
    lr: float = 0.01
    momentum: float = 0.5
    weight_decay: float = 0.0
    grad_clip: float | None = None
    persist_optimizer: bool = False  # keep local optimizer state (momentum) across rounds

    def validate(self) -> None:
        _check(self.lr > 0, f"train.lr must be > 0, got {self.lr}")
        _check(self.local_epochs >= 1, f"train.local_epochs must be >= 1, got {self.local_epochs}")
        _check(self.local_steps is None or self.local_steps >= 1, "train.local_steps must be >= 1")
        _check(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        _check(0.0 <= self.momentum < 1.0, f"train.momentum must be in [0, 1), got {self.momentum}")
        _check(self.weight_decay >= 0, "train.weight_decay must be >= 0")
        _check(self.optimizer in LOCAL_OPTIMIZERS, f"train.optimizer must be one of {', '.join(LOCAL_OPTIMIZERS)}"
               f"{nearest(self.optimizer, LOCAL_OPTIMIZERS)}, got '{self.optimizer}'")
        _check(self.grad_clip is None or self.grad_clip > 0, "train.grad_clip must be > 0")


@dataclass
class ServerConfig:
    """Client sampling and aggregation (FedAvg; FedAvgM / FedAdam via the server optimizer)."""

    fraction_fit: float = 1.0  # fraction of clients sampled per round (seeded)
    min_fit_clients: int = 1
    # weighted (by sample count) | uniform | a robust rule on the shared keys (docs/robust.md): median |
    # trimmed_mean | krum | multi_krum | norm_bound | geometric_median
    aggregation: str = "weighted"
    trim: float = 0.1  # trimmed_mean: the fraction beta of clients cut from each end, per coordinate; in [0, 0.5)
    # f, the attackers assumed per round: krum / multi_krum need n >= 2f + 3 clients, median / trimmed_mean /
    # geometric_median an honest majority (2f < n)
    byzantine: int = 0
    krum_select: int | None = None  # multi_krum: m, how many lowest-score clients are averaged (null: n - f)
    norm_bound: float | None = None  # norm_bound: the bound M on each update's L2 norm (required by the rule)
    rfa_iterations: int = 4  # geometric_median: smoothed Weiszfeld steps after the weighted-mean start (RFA's code)
    rfa_nu: float = 1e-6  # geometric_median: nu, the smoothing floor on the distances (RFA's code)
    optimizer: str = "sgd"  # server optimizer on the pseudo-gradient: sgd (FedAvg/FedAvgM) | adam (FedAdam)
    lr: float = 1.0
    lr_decay: float = 1.0  # StepLR gamma: server step t uses lr * lr_decay^(t-1) (FedEx / FedPop's server alpha)
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-3  # FedAdam's tau (Reddi et al. 2021)
    # the server optimizer steps the model's parameters; its buffers (BatchNorm running statistics) take the
    # clients' average, as a torch optimizer over model.parameters() leaves them (FederatedScope's FedOpt,
    # APPFL's FedAdam); true: step them too (Flower's FedOpt strategies, which see only arrays). Stepping a running
    # variance with lr > 1 or momentum can make it negative: NaN in eval mode
    optimize_buffers: bool = False
    # Flower runtimes only (the in-process runtime has no lost or failed replies); see docs/flower.md "Faults"
    min_fit_fraction: float = 1.0  # share of the sampled clients whose fit replies must arrive valid, else stop
    min_evaluate_fraction: float | None = None  # the same for evaluation replies (None: min_fit_fraction)
    reply_timeout: float = 3600.0  # seconds to wait for the replies of one message wave (train / evaluate)

    def validate(self) -> None:
        _check(0.0 < self.fraction_fit <= 1.0, f"server.fraction_fit must be in (0, 1], got {self.fraction_fit}")
        _check(0.0 < self.min_fit_fraction <= 1.0,
               f"server.min_fit_fraction must be in (0, 1], got {self.min_fit_fraction}")
        _check(self.min_evaluate_fraction is None or 0.0 < self.min_evaluate_fraction <= 1.0,
               f"server.min_evaluate_fraction must be in (0, 1] or null, got {self.min_evaluate_fraction}")
        _check(self.reply_timeout > 0, f"server.reply_timeout must be > 0 seconds, got {self.reply_timeout}")
        _check(self.aggregation in AGGREGATIONS, f"server.aggregation must be one of {', '.join(AGGREGATIONS)}"
               f"{nearest(self.aggregation, AGGREGATIONS)}, got '{self.aggregation}'")
        self._validate_robust()
        _check(self.optimizer in ("sgd", "adam"), "server.optimizer must be sgd or adam")
        _check(self.lr > 0, f"server.lr must be > 0, got {self.lr}")
        _check(0.0 < self.lr_decay <= 1.0, f"server.lr_decay must be in (0, 1], got {self.lr_decay}")
        _check(0.0 <= self.momentum < 1.0, "server.momentum must be in [0, 1)")
        _check(self.min_fit_clients >= 1, "server.min_fit_clients must be >= 1")

    def _validate_robust(self) -> None:
        """The robust rules' keys (docs/robust.md); the client counts a rule needs are checked per round."""
        _check(0.0 <= self.trim < 0.5, f"server.trim (trimmed_mean's fraction cut from each end) must be in "
                                       f"[0, 0.5), got {self.trim}")
        _check(self.byzantine >= 0, f"server.byzantine (the attackers Krum assumes) must be >= 0, got {self.byzantine}")
        _check(self.krum_select is None or self.krum_select >= 1,
               f"server.krum_select (multi-Krum's m) must be >= 1 or null (n - f), got {self.krum_select}")
        _check(self.norm_bound is None or self.norm_bound > 0, f"server.norm_bound must be > 0, got {self.norm_bound}")
        _check(self.aggregation != "norm_bound" or self.norm_bound is not None,
               "server.aggregation norm_bound needs server.norm_bound: the bound on each update's L2 norm")
        _check(self.rfa_iterations >= 1, f"server.rfa_iterations must be >= 1, got {self.rfa_iterations}")
        _check(self.rfa_nu > 0, f"server.rfa_nu must be > 0, got {self.rfa_nu}")


@dataclass
class EvalConfig:
    """When and on what the clients' deployed models are evaluated."""

    every: int = 1
    pooled_test: bool = False  # also evaluate on the union of all clients' test splits
    val: bool = False  # also evaluate on the validation splits

    def validate(self) -> None:
        _check(self.every >= 1, f"eval.every must be >= 1, got {self.every}")


@dataclass
class RunConfig:
    """Where results go and how the run is executed."""

    out_dir: str = "runs"
    checkpoint_every: int = 10
    device: str = "auto"  # cpu | cuda | auto
    runtime: str = "inprocess"
    num_threads: int | None = None  # torch intra-op and BLAS threads (None: the libraries' defaults)
    quiet: bool = False
    # runtime `batched` (docs/runtimes_batched.md): clients per vectorized chunk, and the memory budget of a chunk
    batched_max_clients: int | None = None  # None: as many as the memory budget allows
    batched_memory_mb: float | None = None  # None: 70% of free CUDA memory, or 25% of RAM on CPU
    # fewer clients of one batch size than this train one after another (in-process code); None: 8 on a CPU, where
    # fewer lanes did not pay (docs/results/runtimes.md "Lanes"), 2 on a GPU
    batched_min_lanes: int | None = None
    # lanes of different batch sizes split their batches into micro-batches of the sizes' gcd and train as one group
    # (runtimes/batched/accumulate.py): equal to in-process up to float rounding, not bit for bit
    batched_accumulate: bool = False
    # experiment tracking per round (engine/tracking.py): csv | tensorboard | mlflow | wandb
    loggers: list[str] = field(default_factory=list)

    def validate(self) -> None:
        _check(self.checkpoint_every >= 1, "run.checkpoint_every must be >= 1")
        for name in self.loggers:
            _check(name in LOGGERS, f"run.loggers: unknown logger '{name}'{nearest(name, LOGGERS)}; choose from "
                                    f"{', '.join(LOGGERS)}")
        _check(self.num_threads is None or self.num_threads >= 1,
               f"run.num_threads must be >= 1 (torch threads), got {self.num_threads}; leave it unset (null) for "
               "the libraries' default")
        _check(self.batched_max_clients is None or self.batched_max_clients >= 1,
               "run.batched_max_clients must be >= 1")
        _check(self.batched_memory_mb is None or self.batched_memory_mb > 0, "run.batched_memory_mb must be > 0")
        _check(self.batched_min_lanes is None or self.batched_min_lanes >= 1,
               "run.batched_min_lanes must be >= 1 (1: every group as lanes)")
        _check(self.runtime in RUNTIMES,
               f"run.runtime must be one of {', '.join(RUNTIMES)}{nearest(self.runtime, RUNTIMES)}, "
               f"got '{self.runtime}'")
        _check(self.device in ("cpu", "cuda", "auto") or self.device.startswith("cuda:"),
               f"run.device must be cpu, cuda or auto, got '{self.device}'")

