"""Sweeps: methods x seeds x datasets from one config; finished runs are skipped, interrupted ones resumed."""

from __future__ import annotations

import copy
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from tqdm.auto import tqdm

from fedhet.config import ExperimentConfig, deep_merge, from_dict
from fedhet.engine.loop import run_dir_for
from fedhet.engine.rundir import RunDirectory
from fedhet.errors import ConfigError, nearest, unknown_choice
from fedhet.launch.run import run_experiment
from fedhet.yaml_input import JSONDict

if TYPE_CHECKING:
    from fedhet.models.base import SplitModel

log = logging.getLogger(__name__)

SWEEP_KEYS = ("methods", "variants", "seeds", "datasets", "overrides", "tune")  # tune: tune/sweep.py


@dataclass
class SweepPlan:
    """The configs of a sweep, in run order."""

    configs: list[ExperimentConfig]

    def run_dirs(self) -> list[Path]:
        return [run_dir_for(c) for c in self.configs]


def plan_sweep(cfg: ExperimentConfig, methods: list[str] | None = None, seeds: list[int] | None = None,
               datasets: list[str] | None = None) -> SweepPlan:
    """Expand `cfg.sweep` (methods, variants, seeds, datasets, per-method `overrides`) into one config per run.

    `overrides` maps a method name to a nested dict merged into that method's config (e.g. its
    `method_args` or `train` settings), so each method keeps its own tuned hyperparameters.
    `variants` maps a label to a nested dict merged like an override, which may set `method` (default: the
    config's `method`); each variant runs under its label (run dir, report column), e.g. ablations of one method:
    `variants: {fraug_no_ema: {method: fraug, method_args: {use_ema: false}}}`. A method's `overrides` apply
    to its variants too, before the variant's own settings; a variant's `method_args: null` drops the inherited
    method_args (a baseline of another method in a sweep of one method's settings). `methods` given here (the
    CLI's --methods) may name variants.
    """
    spec = dict(cfg.sweep)
    for key in spec:
        if key not in SWEEP_KEYS:
            raise ConfigError(f"unknown sweep key '{key}'{nearest(key, SWEEP_KEYS)}; valid: {', '.join(SWEEP_KEYS)}")
    variants: JSONDict = spec.get("variants") or {}
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise ConfigError("sweep.variants must map a label to a dict of settings, e.g. {fraug_no_ema: "
                          "{method: fraug, method_args: {use_ema: false}}}")
    if methods is None:
        methods = list(spec.get("methods") or ([] if variants else [cfg.method])) + list(variants)
    _check_entries(methods, variants)
    seeds = seeds if seeds is not None else spec.get("seeds") or [cfg.seed]
    datasets = datasets or spec.get("datasets") or [cfg.data.dataset]
    overrides: JSONDict = spec.get("overrides") or {}
    base = cfg.to_dict()
    base["sweep"] = {}
    configs = []
    for dataset, entry, seed in itertools.product(datasets, methods, seeds):
        variant = variants.get(entry)
        method = str(variant.get("method", cfg.method)) if variant is not None else entry
        tree = copy.deepcopy(base)
        tree.update(method=method, seed=int(seed), label=entry if variant is not None else base.get("label", ""))
        tree["data"]["dataset"] = dataset
        deep_merge(tree, overrides.get(method, {}))
        if variant is not None:
            if "method_args" in variant and variant["method_args"] is None:  # a baseline of another method
                tree["method_args"] = {}
            deep_merge(tree, {k: v for k, v in variant.items() if k != "method" and v is not None})
        one = from_dict(ExperimentConfig, tree)
        one.validate()
        configs.append(one)
    return SweepPlan(configs)


def _check_entries(entries: list[str], variants: JSONDict) -> None:
    """Every entry of the method list names a registered method or a variant of `sweep.variants`."""
    from fedhet.algorithms import ALGORITHMS

    names = [*ALGORITHMS.names(), *variants]
    for entry in entries:
        if not isinstance(entry, str) or entry not in names:
            raise unknown_choice("method (or sweep variant)", str(entry), names)


def run_status(run_dir: Path, rounds: int | None = None, cfg: ExperimentConfig | None = None) -> str:
    """finished (its summary reached `rounds`), resume (has a checkpoint: interrupted, or finished with fewer
    rounds, so a larger `rounds` extends it) or new. A finished run made with a config other than `cfg` (a
    results-relevant key besides `rounds`) raises a ConfigError: skipping it would report the old results."""
    rundir = RunDirectory(run_dir)
    if rundir.is_finished():
        try:
            done = json.loads(rundir.summary_path.read_text()).get("rounds_completed")
        except (OSError, ValueError):
            done = None
        if cfg is not None:
            check_same_config(rundir, cfg)
        if rounds is None or not isinstance(done, int) or done >= rounds:
            return "finished"
    return "resume" if rundir.latest_checkpoint.is_file() else "new"


def check_same_config(rundir: RunDirectory, cfg: ExperimentConfig) -> None:
    """A ConfigError if the finished run in `rundir` was made with a config other than `cfg` (besides rounds)."""
    from fedhet.engine.checkpoint import config_differences

    try:
        old = yaml.safe_load(rundir.config_path.read_text())
    except (OSError, yaml.YAMLError):
        return  # no readable config: nothing to compare (the summary alone marks it finished)
    differences = {k: v for k, v in config_differences(old, cfg.to_dict()).items() if k != "rounds"}
    if differences:
        listed = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in differences.items())
        raise ConfigError(f"{rundir.path} holds a finished run made with another config ({listed}). Give this "
                          "sweep another name (name=...), or delete that folder to run it again. Nothing was run.")


def check_plan(plan: SweepPlan, prefix: bool = True, statuses: bool = True) -> list[tuple[ExperimentConfig, str]]:
    """Validate every planned run without loading data or training: the dataset name, the model (built, without
    pretrained weights, at the dataset's input shape when the registry knows it) and the method (its
    `method_args` validated and the algorithm constructed on that model, which catches e.g. FedBN on a model
    without BatchNorm). Returns (config, status) per run, status one of finished / resume / new; the first
    invalid run raises its ConfigError, prefixed with the run's label and seed (unless `prefix` is false, as for
    the single run of `fedhet run`). `statuses=False` skips the run folders (status "unchecked"): `fedhet run`
    checks its own folder, the one `--run-dir` names, with `--overwrite` / `--resume` applied."""
    import torch

    from fedhet.algorithms import ALGORITHMS
    from fedhet.data.registry import DatasetSpec, resolve_spec
    from fedhet.engine.experiment import method_params
    from fedhet.models import build_model

    checked = []
    built: set[str] = set()  # runs that differ only in seed (or out_dir) build the same model and method
    specs: dict[str, DatasetSpec] = {}  # imagefolder / csv read data.root once per data config
    for cfg in plan.configs:
        try:
            if repr(cfg.data) not in specs:
                specs[repr(cfg.data)] = resolve_spec(cfg.data)
            spec = specs[repr(cfg.data)]
            if cfg.model.init_from and not Path(cfg.model.init_from).is_file():
                raise ConfigError(f"model.init_from={cfg.model.init_from!r}: no such file; pretrain it first "
                                  "(fedhet pretrain CONFIG --out PATH) or leave init_from unset")
            cls = ALGORITHMS.get(cfg.method)
            params = method_params(cfg)
            size = cfg.data.image_size or spec.default_image_size
            shape = (spec.channels, size, size) if spec.modality == "image" and size else (
                (spec.feature_dim,) if spec.feature_dim else None)
            key = repr((cfg.method, params, cfg.model, cfg.data.dataset, shape, len(spec.classes), cfg.train,
                        cfg.server))
            if shape is not None and key not in built:
                model = build_model(cfg.model.name, len(spec.classes), shape, pretrained=False, **cfg.model.args)
                cls(params, _factory(model), cfg.train, cfg.server, len(spec.classes), torch.device("cpu"))
                built.add(key)
        except ConfigError as err:
            if not prefix:
                raise
            raise ConfigError(f"sweep run {cfg.variant} seed {cfg.seed} ({cfg.data.dataset}): {err}") from err
        checked.append((cfg, run_status(run_dir_for(cfg), cfg.rounds, cfg) if statuses else "unchecked"))
    return checked


def _factory(model: SplitModel) -> Callable[[], SplitModel]:
    """A model factory that returns `model` (bound now, not at call time)."""
    return lambda: model


def run_sweep(plan: SweepPlan, progress: bool = True) -> list[Path]:
    """Run every config of the plan; skip finished runs and resume interrupted ones."""
    done = []
    bar = tqdm(plan.configs, desc="sweep", unit="run", disable=not progress, position=0)
    for cfg in bar:
        run_dir = run_dir_for(cfg)
        bar.set_postfix_str(f"{cfg.method} {cfg.data.dataset} seed {cfg.seed}")
        status = run_status(run_dir, cfg.rounds)
        if status == "finished":
            log.info("skipping finished run %s", run_dir)
        else:
            run_experiment(cfg, run_dir, resume=status == "resume", progress=progress)
        done.append(run_dir)
    return done
