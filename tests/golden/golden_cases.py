"""The golden cases (issue 14 item 5): which runs are recorded in golden.json and must keep their numbers.

Every registered method, on the offline default dataset (`offline_digits`, the quickstart's settings made small:
10% of each client's training pool (22 images), 64 test images per client, 3 rounds of 3 local steps, one torch
thread, seed 0), in-process; plus variants that exercise the parts of the contract the refactor moves (Ditto's
tandem schedule, the persisted optimizer blocks, client sampling, the server optimizer, epoch-based local
training, augmentation, extra evaluation splits), the batched runtime (FedAvg, FedProx, FedBN, Ditto) and
Flower's simulation engine (FedBN, Ditto with client sampling).

A case's `overrides` are `key=value` config overrides applied after `BASE`; its name must not change once
recorded. `tolerance_reason` lets a case be compared within the stated tolerance even on the recording machine,
for a change that must re-order floating-point operations: say why, in one sentence (unused so far).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedhet.config import ExperimentConfig, load_config

RUNTIMES = ("inprocess", "batched", "flower-simulation")

# configs/quickstart.yaml's data, model and optimizer, shrunk; every results-relevant key is spelled out so that
# a change of a config default does not silently change the golden runs' inputs.
BASE: tuple[str, ...] = (
    "seed=0", "rounds=3",
    "data.dataset=offline_digits", "data.partition=domain", "data.fraction=0.1", "data.test_fraction=0.5",
    "data.augment=false", "data.val_fraction=0.0", "data.max_test_per_client=64",
    "model.name=small_cnn", "model.args={width: 8}",
    "train.local_steps=3", "train.batch_size=16", "train.optimizer=sgd", "train.lr=0.05", "train.momentum=0.5",
    "train.weight_decay=0.0", "train.persist_optimizer=false",
    "server.aggregation=uniform", "server.fraction_fit=1.0", "server.optimizer=sgd", "server.lr=1.0",
    "eval.every=1", "eval.pooled_test=false", "eval.val=false",
    "run.device=cpu", "run.num_threads=1", "run.quiet=true", "run.checkpoint_every=10",
)

NO_BN = "model.args={width: 8, norm: none}"
# FRAug's cases were recorded before issue 37 made the official code's setting the default; they keep that reading
PAPER = "method_args.preset=paper"


@dataclass(frozen=True)
class GoldenCase:
    """One golden run: config overrides on top of `BASE`, the runtime, and what is fingerprinted."""

    name: str
    overrides: tuple[str, ...]
    runtime: str = "inprocess"  # inprocess | batched | flower-simulation
    global_model: bool = True  # False: the server holds no model (FedProto's prototypes); only metrics count
    tolerance_reason: str | None = None  # set: compared within the tolerance everywhere, for this reason
    tier: str = "batchnorm"  # the tolerance tier (golden_compare.TIERS): batchnorm | well_conditioned
    slow: bool = False  # True: only with `-m slow`

    @property
    def method(self) -> str:
        return next(o.split("=", 1)[1] for o in self.overrides if o.startswith("method="))

    def config(self) -> ExperimentConfig:
        """The experiment config (Flower cases: the in-process config that `run_flower_simulation` takes)."""
        runtime = "batched" if self.runtime == "batched" else "inprocess"
        lanes = ["run.batched_min_lanes=1"] if runtime == "batched" else []  # lanes, however few clients
        return load_config(None, [*BASE, *self.overrides, f"run.runtime={runtime}", *lanes])


def _case(name: str, method: str, *overrides: str, **kw: object) -> GoldenCase:
    return GoldenCase(name, (f"method={method}", *overrides), **kw)  # type: ignore[arg-type]


def _no_bn(name: str, method: str, *overrides: str, **kw: object) -> GoldenCase:
    """The same CNN without BatchNorm: well-conditioned (an operation-order change moved its losses by <= 5.2e-8
    relative, against up to 1.1e-1 with BatchNorm on this data; docs/golden.md), so another machine can compare
    it tightly."""
    return _case(name, method, NO_BN, *overrides, tier="well_conditioned", **kw)


CASES: tuple[GoldenCase, ...] = (
    # every registered method, defaults
    _case("fedavg", "fedavg"),
    _case("fedprox", "fedprox", "method_args.mu=0.1"),
    _case("fedbn", "fedbn"),
    _case("ditto", "ditto"),
    _case("ditto_mmd", "ditto_mmd"),
    _case("fraug", "fraug", PAPER),
    _case("scaffold", "scaffold"),
    _case("moon", "moon"),
    _case("fedproto", "fedproto", global_model=False),
    _case("fedbabu", "fedbabu"),
    _case("fedrep", "fedrep", "method_args.head_epochs=1"),
    _case("pfedavg", "pfedavg"),
    _case("partialfed_fix", "partialfed", "method_args.variant=fix"),
    _case("partialfed_adaptive", "partialfed", "method_args.variant=adaptive"),
    _case("single", "single"),
    _case("all", "all"),
    _case("embnoise", "embnoise"),
    # method variants with their own code paths
    _case("ditto_tandem", "ditto", "method_args.schedule=tandem"),
    _case("ditto_sampled", "ditto", "server.fraction_fit=0.5"),
    _case("ditto_mmd_mmdd", "ditto_mmd", "method_args.penalty=mmdd", "method_args.refit_interval=2",
          "method_args.n_accumulate=2", "method_args.kernel_steps=2"),
    _case("ditto_mmd_cosine", "ditto_mmd", "method_args.penalty=cosine"),
    _case("moon_projection", "moon", "method_args.projection_dim=16"),
    _case("fedproto_prototype", "fedproto", "method_args.inference=prototype", global_model=False),
    _case("pfedavg_head", "pfedavg", "method_args.finetune_part=head"),
    _case("embnoise_laplace_global_bn", "embnoise", "method_args.distribution=laplace",
          "method_args.local_bn=false"),
    _case("fraug_no_generator", "fraug", PAPER, "method_args.use_generator=false"),
    # the engine around the methods: optimizer persistence (4 copies today), sampling, server optimizer, epochs
    _case("fedavg_persist_optimizer", "fedavg", "train.persist_optimizer=true"),
    _case("ditto_persist_optimizer", "ditto", "train.persist_optimizer=true"),
    _case("fedrep_persist_optimizer", "fedrep", "method_args.head_epochs=1", "train.persist_optimizer=true"),
    _case("fraug_persist_optimizer", "fraug", PAPER, "train.persist_optimizer=true"),
    _case("fedavg_sampled_weighted", "fedavg", "server.fraction_fit=0.5", "server.aggregation=weighted"),
    _case("fedadam", "fedavg", "server.optimizer=adam", "server.lr=0.01"),
    _case("fedavg_epochs", "fedavg", "train.local_steps=null", "train.local_epochs=2"),
    _case("fedprox_adamw_clip", "fedprox", "train.optimizer=adamw", "train.lr=0.005", "train.weight_decay=0.01",
          "train.grad_clip=1.0"),
    _case("fedavg_augment", "fedavg", "data.augment=true"),
    _case("fedavg_val_pooled", "fedavg", "data.val_fraction=0.2", "eval.val=true", "eval.pooled_test=true"),
    # without BatchNorm: the tight tier of the tolerance mode
    _no_bn("fedavg_no_bn", "fedavg"),
    _no_bn("fedprox_no_bn", "fedprox"),
    _no_bn("ditto_no_bn", "ditto"),
    _no_bn("scaffold_no_bn", "scaffold"),
    _no_bn("fedavg_persist_optimizer_no_bn", "fedavg", "train.persist_optimizer=true"),
    _no_bn("batched_fedavg_no_bn", "fedavg", runtime="batched"),
    _no_bn("batched_ditto_no_bn", "ditto", runtime="batched"),
    # the batched runtime (vectorized local training)
    _case("batched_fedavg", "fedavg", runtime="batched"),
    _case("batched_fedprox", "fedprox", "method_args.mu=0.1", runtime="batched"),
    _case("batched_fedbn", "fedbn", runtime="batched"),
    _case("batched_ditto", "ditto", runtime="batched"),
    _case("batched_fedavg_persist_optimizer", "fedavg", "train.persist_optimizer=true", runtime="batched"),
    # Flower's simulation engine (Ray backend, one virtual SuperNode per client)
    # (slow: 12-19 s each, mostly Ray start-up; their numbers equal the in-process fedbn / ditto_sampled cases')
    _case("flower_fedbn", "fedbn", runtime="flower-simulation", slow=True),
    _case("flower_ditto_sampled", "ditto", "server.fraction_fit=0.5", runtime="flower-simulation", slow=True),
)

CASES_BY_NAME: dict[str, GoldenCase] = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "golden case names must be unique"
assert all(c.runtime in RUNTIMES and c.tier in ("batchnorm", "well_conditioned") for c in CASES)
