"""docs/config.md, generated from the config dataclasses: every key with its default and its meaning.

    python -m fedhet.config_doc --write docs/config.md    # regenerate after changing src/fedhet/config/
    python -m fedhet.config_doc --check docs/config.md    # exit 1 when the page is out of date

A key's meaning is its inline comment in the dataclass (or the comment lines right above it), else the entry in
`MEANINGS`; tests/engine/test_config_doc.py fails when the page differs from what this module renders or a key
has no meaning.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from fedhet import config as C
from fedhet.config.attack import AttackConfig
from fedhet.config.privacy import PrivacyConfig

MEANINGS = {
    "name": "experiment name: runs go to `run.out_dir/<name>/<dataset>/<label or method>/seed<seed>`",
    "method": "the federated method (`fedhet methods` lists them; docs/methods.md)",
    "method_args": "the method's own settings (see [Method arguments](#method-arguments))",
    "seed": "seeds data splits, model initialisation, client sampling and training",
    "rounds": "communication rounds",
    "imports": "Python modules (`my_pkg.my_datasets`) or `.py` files (a relative path: beside the config file, "
               "else in the current directory) imported before any name is looked up, to register your datasets, "
               "models or methods (docs/data.md)",
    "data.dataset": "dataset name (`fedhet data list`; docs/data.md)",
    "data.root": "data root (default: $FEDHET_DATA); for `imagefolder` and `csv` the dataset's own folder or file",
    "model.name": "registered model (see [Model arguments](#model-arguments))",
    "model.args": "keyword arguments of the model factory (see [Model arguments](#model-arguments))",
    "model.pretrained": "start from pretrained weights (models that ship them, e.g. efficientnet_lite0)",
    "train.local_epochs": "local epochs per round (ignored when `local_steps` is set)",
    "train.batch_size": "local mini-batch size",
    "train.lr": "local learning rate",
    "train.momentum": "SGD momentum of the local optimizer (sgd only)",
    "train.weight_decay": "L2 weight decay (adamw: decoupled)",
    "train.grad_clip": "clip the gradient norm to this value (null: no clipping)",
    "server.min_fit_clients": "at least this many clients are sampled per round",
    "server.lr": "server learning rate on the averaged update (1.0 with sgd and momentum 0: plain FedAvg)",
    "server.momentum": "server momentum (FedAvgM)",
    "server.betas": "FedAdam's beta1, beta2",
    "eval.every": "evaluate every this many rounds (and always after the last)",
    "run.out_dir": "root folder of run directories",
    "run.runtime": "inprocess | batched (vectorized clients, docs/runtimes_batched.md) | flower | "
                   "flower-simulation (docs/flower.md)",
    "run.batched_max_clients": "batched runtime: clients per vectorized chunk (null: as many as the memory budget "
                               "allows)",
    "run.batched_memory_mb": "batched runtime: memory budget of a chunk in MB (null: 70% of free CUDA memory, or "
                             "25% of RAM on CPU)",
    "run.batched_min_lanes": "batched runtime: a batch-size group of at least this many clients trains as lanes, "
                             "no measurement (null: groups of 8+ on a CPU, 2+ on a GPU as lanes where a "
                             "calibration at first use, cached, measures them faster)",
    "run.batched_accumulate": "batched runtime: clients of different batch sizes train as one group, each batch split "
                              "into micro-batches of the sizes' gcd (FedAvg / FedProx losses; equal to in-process up "
                              "to float rounding)",
    "run.checkpoint_every": "write a checkpoint every this many rounds (and after the last)",
    "run.quiet": "no progress bar, and the final table printed as a summary (mean, min, max, worst 3 clients; so "
                 "too above 20 clients)",
}
SWEEP_MEANINGS = {
    "methods": "methods (or variant labels) to run; default: `[method]`",
    "variants": "label -> settings of a named variant (e.g. an ablation), run like a method",
    "seeds": "seeds to run; default: `[seed]`",
    "datasets": "datasets to run; default: `[data.dataset]`",
    "overrides": "method or variant -> settings applied to its runs only",
    "tune": "a tuned sweep: {budget, tuners, seed, seeds, space}; each method tuned at the same budget in "
            "client-rounds, then re-run on fresh seeds (docs/tune.md, Tuned sweeps)",
}
SECTIONS = (("data", C.DataConfig), ("model", C.ModelConfig), ("train", C.TrainConfig),
            ("server", C.ServerConfig), ("eval", C.EvalConfig), ("run", C.RunConfig), ("novel", C.NovelConfig),
            ("privacy", PrivacyConfig), ("attack", AttackConfig))


def render_value(value: Any) -> str:  # Any: a config default
    """A default as YAML (null, true, [0.9, 0.99], {})."""
    if dataclasses.is_dataclass(value):
        return "(section)"
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").strip()


def default_of(f: dataclasses.Field[Any]) -> Any:  # Any: a config field and its default
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its inline comment, or the full-line comments right above it."""
    out: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"^ {4}(?: {4})?(\w+): [^=]+?(?:=.*?)?(?:#\s*(.*))?$", line)
        if m and not stripped.startswith(("def ", "return ", "class ")) and "(" not in line.split(":")[0]:
            out.setdefault(m.group(1), m.group(2) or " ".join(above))
        above = []
    return out


def rows(cls: type, prefix: str, nested: bool = False) -> list[tuple[str, str, str]]:
    """(dotted key, default, meaning) of each field of dataclass `cls`; a field that is itself a dataclass is
    skipped (a section of its own) or, with `nested`, listed field by field under its dotted key."""
    comments = field_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = default_of(f)
        if dataclasses.is_dataclass(default):
            out += rows(type(default), f"{key}.", nested) if nested else []
            continue
        out.append((key, render_value(default), MEANINGS.get(key) or comments.get(f.name, "")))
    return out


def table(items: list[tuple[str, str, str]], meanings: bool = True) -> list[str]:
    if not meanings:
        return ["| key | default |", "| --- | --- |", *(f"| `{k}` | `{d}` |" for k, d, _ in items), ""]
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, default, meaning in items:
        lines.append(f"| `{key}` | `{default}` | {meaning.replace('|', '&#124;')} |")
    return lines + [""]


def dataset_sections() -> list[str]:
    from fedhet.data.registry import DATASETS, list_datasets

    out = []
    for name in list_datasets():
        spec = DATASETS.get(name)
        if spec.options is not None and spec.options.__module__.startswith("fedhet."):
            out += [f"### `data.options` of `{name}`", "", *table(rows(spec.options, "data.options."))]
    return out


def method_sections() -> list[str]:
    from fedhet.algorithms import ALGORITHMS

    out = []
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        params = getattr(cls, "Params", None)
        if not cls.__module__.startswith("fedhet.") or params is None or not dataclasses.fields(params):
            continue
        doc = " ".join((inspect.getdoc(params) or "").split())
        out += [f"### `{name}`", "", doc, ""] if doc else [f"### `{name}`", ""]
        out += table(rows(params, "method_args.", nested=True), meanings=False)
    return out


def model_sections() -> list[str]:
    from fedhet.models.base import MODELS, model_args

    out = ["| model | `model.args` and their defaults |", "| --- | --- |"]
    for name in MODELS.names():
        if MODELS.get(name).__module__.startswith("fedhet."):
            args = ", ".join(f"`{k}: {render_value(v)}`" for k, v in model_args(name).items()) or "(none)"
            out.append(f"| `{name}` | {args} |")
    return out + [""]


INTRO = """# Configuration reference

<!-- Generated by `python -m fedhet.config_doc --write docs/config.md` from src/fedhet/config/, the
methods' Params, the models' factories and the datasets' options. Do not edit by hand:
tests/engine/test_config_doc.py fails when this page and the code disagree. -->

A config is a YAML file (`fedhet run CONFIG`), optionally starting from another with `extends: <path>`, plus
`key=value` overrides on the command line (`train.lr=0.05 data.options.channels=1`). Every key below is
optional; an unknown key is an error naming the nearest valid one. The defaults follow the FRAug / FedBN
training recipes, so some may surprise: `train.optimizer: {optimizer}` with `train.momentum: {momentum}`,
`train.lr: {lr}`, and `data.augment: {augment}` (random crops, flips and colour jitter on image datasets;
set `data.augment: false` for none).
"""


def render() -> str:
    """The whole page."""
    t, d = C.TrainConfig(), C.DataConfig()
    lines = [INTRO.format(optimizer=t.optimizer, momentum=t.momentum, lr=t.lr, augment=render_value(d.augment)),
             "## Top level", "", *table(rows(C.ExperimentConfig, ""))]
    for section, cls in SECTIONS:
        doc = " ".join((inspect.getdoc(cls) or "").split())
        lines += [f"## `{section}`", "", doc, "", *table(rows(cls, f"{section}.", nested=True))]
    lines += ["## Dataset options", "",
              "Settings only some datasets take live under `data.options`, checked against the dataset's own list "
              "(an unknown key names the nearest valid one; a dataset without options refuses any).", "",
              *dataset_sections()]
    lines += ["## Model arguments", "", *model_sections()]
    lines += ["## Method arguments", "", "`method_args` of each method (unknown keys are errors naming the nearest "
              "valid one); the meanings are in the method's paragraph and its page (docs/methods.md, "
              "docs/fraug.md, docs/ditto_mmd.md).", "", *method_sections()]
    from fedhet.launch.sweep import SWEEP_KEYS

    lines += ["## `sweep`", "", "Read by `fedhet sweep` only.", "",
              *table([(f"sweep.{k}", "(none)", SWEEP_MEANINGS.get(k, "")) for k in SWEEP_KEYS])]
    from fedhet.tune.config import TuneConfig

    lines += ["", "## `tune`", "", "Read by `fedhet tune` only (population-based tuning, docs/tune.md).", "",
              *table(rows(TuneConfig, "tune."))]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedhet.config_doc", description="write or check docs/config.md")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH")
    group.add_argument("--check", metavar="PATH")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        Path(args.write).write_text(page)
    elif args.check:
        if Path(args.check).read_text() != page:
            print(f"{args.check} is out of date: run python -m fedhet.config_doc --write {args.check}")
            return 1
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
