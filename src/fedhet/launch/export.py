"""`fedhet export RUN_DIR [--out DIR]`: a finished run's deployable models as plain state_dict files.

Each training client's model is the one the method deploys (`engine.local.deployed_model`, exactly as the run's
last evaluation built it: FedBN's local BN, Ditto's personal model, FedRep's head, AdaptFED's generated
weights), the global model is the server's (only where the server holds a whole model: FedAvg, FedProx, Ditto's
w; FedBN, FedRep, AdaptFED have none). The folder holds:

    export.json         run, method, fedhet version, client name -> file and final metrics, the global model
    model.json          what rebuilds the architecture: model name, args, num_classes, input_shape, classes
    clients/<name>.pt   one state_dict per client (torch.save of tensors only)
    global.pt           the global model's state_dict, where the method has one

`fedhet.load_exported(folder, client=NAME)` (launch/exported.py) rebuilds a model from it. The folder is written
whole into a temporary folder beside it, then renamed into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedhet.atomic import current_umask, strict_json
from fedhet.config import ExperimentConfig, load_config
from fedhet.core.contract import ServerState
from fedhet.core.seeding import EVALUATE, client_stream, seeded
from fedhet.engine.checkpoint import load_checkpoint
from fedhet.engine.executor import ClientStates
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.local import deployed_model
from fedhet.engine.rundir import RunDirectory
from fedhet.errors import FedhetError
from fedhet.launch.exported import EXPORT_FILE, GLOBAL_FILE, MODEL_FILE
from fedhet.launch.run import make_executor
from fedhet.yaml_input import JSONDict

StateDict = dict[str, torch.Tensor]
NO_GLOBAL = "the server holds no whole model (part of each client's model stays local): deploy the client models"


@dataclass
class Export:
    """What an export folder holds: the models by client name, the global model (None: the method has none,
    `note` says why), the architecture and the manifest's facts."""

    clients: dict[str, StateDict]
    spec: JSONDict
    facts: JSONDict
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    global_model: StateDict | None = None
    note: str = ""
    heads: dict[str, list[int]] = field(default_factory=dict)  # clients whose head predicts only these class ids


@dataclass
class LoadedRun:
    """A finished run rebuilt: its config, experiment, server state and client states (checkpoint's last round)."""

    cfg: ExperimentConfig
    exp: Experiment
    server: ServerState
    states: ClientStates
    round: int


def checked_run(run_dir: str | Path) -> RunDirectory:
    """The run directory, if it holds a finished run with a checkpoint; else one FedhetError saying what to do."""
    rundir = RunDirectory(Path(run_dir))
    if not rundir.path.is_dir():
        raise FedhetError(f"run directory '{run_dir}' not found; give the folder `fedhet run` printed as 'results:'")
    if not rundir.config_path.is_file() or not rundir.latest_checkpoint.is_file():
        raise FedhetError(f"{run_dir} is not a fedhet run directory with a checkpoint (config.yaml and the latest "
                          "checkpoint); give the folder `fedhet run` printed as 'results:'")
    if not rundir.is_finished():
        raise FedhetError(f"{run_dir} has not finished training; finish it first (fedhet run CONFIG --resume)")
    return rundir


def load_run(rundir: RunDirectory, overrides: list[str] | None = None) -> LoadedRun:
    """Build the run's experiment from its config.yaml (+ `overrides`) and restore its last checkpoint."""
    cfg = load_config(rundir.config_path, overrides or [])
    exp = build_experiment(cfg)
    executor = make_executor(exp)
    payload = load_checkpoint(rundir.latest_checkpoint, executor.checkpoint_config(cfg.to_dict()))
    executor.set_states(payload["clients"])
    return LoadedRun(cfg, exp, payload["server"], executor.get_states(), int(payload["round"]))


def plain_state(module: torch.nn.Module) -> StateDict:
    """A module's weights as CPU tensors that share nothing with it (a method's `export_state_dict()` when it
    has one: weights a wrapper generates, e.g. AdaptFED's novel-client model)."""
    own = getattr(module, "export_state_dict", None)
    state = own() if callable(own) else module.state_dict()
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def shapes(exp: Experiment) -> dict[str, tuple[int, ...]]:
    """The configured model's weight names and shapes."""
    return {k: tuple(v.shape) for k, v in exp.model_fn().state_dict().items()}


def check_architecture(exp: Experiment, template: dict[str, tuple[int, ...]], state: StateDict, who: str) -> None:
    """`state` must load into the configured model; else the method deploys another network (a wrapper)."""
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != template:
        extra, missing = sorted(set(got) - set(template)), sorted(set(template) - set(got))
        raise FedhetError(f"{who}: method {exp.config.method} deploys a network other than the configured model "
                          f"'{exp.config.model.name}' (keys not in it: {extra[:3]}, missing: {missing[:3]}), which "
                          "an export cannot rebuild; export supports methods that deploy the configured model")


def client_models(run: LoadedRun) -> dict[str, StateDict]:
    """Each training client's deployed model, by client name, built as the run's last evaluation built it."""
    exp, alg = run.exp, run.exp.algorithm
    if not all(i in run.states for i in range(len(exp.arrangement.train))):
        raise FedhetError(f"the checkpoint of this run (run.runtime={run.cfg.run.runtime}) holds no client states: "
                          "the Flower runtime keeps them on the clients, so their deployed models cannot be rebuilt "
                          "here; export runs of the in-process or batched runtime")
    out: dict[str, StateDict] = {}
    template = shapes(exp)
    for cid in exp.arrangement.pool(len(exp.data.clients)):
        owner = exp.arrangement.state_of[cid]
        msg = alg.broadcast(run.server, exp.round_info(run.round), owner)
        with seeded(*client_stream(run.cfg.seed, run.round, cid, EVALUATE)):
            model, _ = deployed_model(alg, msg, run.states[owner], exp.context(cid, run.round))
        name = exp.data.clients[cid].name
        out[name] = plain_state(model)
        check_architecture(exp, template, out[name], f"client '{name}'")
    return out


def global_model(run: LoadedRun) -> StateDict | None:
    """The server's model when it holds every weight of the architecture (FedAvg's, Ditto's w), else None."""
    shared = getattr(run.server, "model", None)
    template = shapes(run.exp)
    if not isinstance(shared, dict) or not set(template) <= set(shared):
        return None
    state = plain_state(run.exp.algorithm.server_model(run.server))
    check_architecture(run.exp, template, state, "the global model")
    return state


def model_spec(cfg: ExperimentConfig, exp: Experiment) -> JSONDict:
    """model.json: what `load_exported` needs to rebuild the architecture, and the data it expects."""
    data = exp.data
    return {"model": cfg.model.name, "args": dict(cfg.model.args), "num_classes": data.num_classes,
            "input_shape": list(data.input_shape), "classes": list(data.classes), "imports": list(cfg.imports),
            "vocabulary": list(data.vocabulary), "modality": data.modality,
            "data": {"dataset": cfg.data.dataset, "image_size": cfg.data.image_size,
                     "options": dict(cfg.data.options)}}


def fedhet_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedhet")
    except PackageNotFoundError:
        from fedhet.version import __version__

        return __version__


def file_names(names: list[str]) -> dict[str, str]:
    """Client name -> its file under clients/: the name with anything but letters, digits, . _ - replaced, made
    unique (the manifest maps names to files, so a replaced character loses nothing)."""
    out: dict[str, str] = {}
    for name in names:
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "client"
        candidate, k = stem, 1
        while f"clients/{candidate}.pt" in out.values():
            k += 1
            candidate = f"{stem}-{k}"
        out[name] = f"clients/{candidate}.pt"
    return out


def manifest(export: Export, files: dict[str, str]) -> JSONDict:
    """export.json: the facts, each client's file and final metrics, and the global model (or why none)."""
    clients = {n: {"file": files[n], "metrics": export.metrics.get(n),
                   **({"classes": export.heads[n]} if n in export.heads else {})} for n in export.clients}
    glob: JSONDict = {"file": None, "note": export.note}
    if export.global_model is not None:
        glob = {"file": GLOBAL_FILE, "metrics": export.metrics.get("pooled")}
    return {**export.facts, "fedhet_version": fedhet_version(), "clients": clients, "global": glob,
            "load": "fedhet.load_exported(FOLDER, client=NAME) (client=None: the global model)"}


def fill_folder(folder: Path, export: Export) -> None:
    """Write the export's files into `folder` (empty)."""
    files = file_names(list(export.clients))
    (folder / "clients").mkdir()
    for name, state in export.clients.items():
        torch.save(state, folder / files[name])
    if export.global_model is not None:
        torch.save(export.global_model, folder / GLOBAL_FILE)
    (folder / MODEL_FILE).write_text(strict_json(export.spec, indent=1))
    (folder / EXPORT_FILE).write_text(strict_json(manifest(export, files), indent=1))


def check_out(out: Path, overwrite: bool) -> None:
    """`out` may become the export folder: absent or empty, or (with overwrite) a folder to replace."""
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out '{out}' is a file; give a folder for the export")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FedhetError(f"--out '{out}' exists and is not empty; give another folder, or pass --overwrite to "
                          "replace it")
    from fedhet.outpaths import check_output_dir

    check_output_dir(out, "--out", "the exported models")


def write_folder(out: Path, fill: Callable[[Path], None]) -> Path:
    """Fill a temporary folder beside `out`, then rename it to `out` (an existing `out` is replaced only once
    the new one is complete): readers see the old folder or the whole new one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~current_umask())
    old: Path | None = None
    try:
        fill(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old)  # onto an empty folder: allowed
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.replace(old, out)
        elif old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def final_metrics(rundir: RunDirectory) -> dict[str, dict[str, float]]:
    """summary.json's metrics at the final round, by client ('avg', 'pooled' too)."""
    return dict(json.loads(rundir.summary_path.read_text()).get("final", {}))


def export_run(run_dir: str | Path, out: str | Path | None = None, overwrite: bool = False) -> Path:
    """Export the finished run in `run_dir` into `out` (default: RUN_DIR/export); returns the folder."""
    rundir = checked_run(run_dir)
    folder = Path(out) if out is not None else rundir.path / "export"
    check_out(folder, overwrite)
    with rundir.locked():
        run = load_run(rundir)
        clients, glob = client_models(run), global_model(run)
    facts = {"run": str(rundir.path.resolve()), "name": run.cfg.name, "method": run.cfg.method,
             "seed": run.cfg.seed, "round": run.round, "personalized": run.exp.algorithm.personalized,
             "held_out": [run.exp.data.clients[c].name for c in run.exp.arrangement.novel]}
    heads = {c.name: list(c.classes) for c in run.exp.data.clients if c.classes is not None and c.name in clients}
    export = Export(clients, model_spec(run.cfg, run.exp), facts, final_metrics(rundir), glob,
                    "" if glob is not None else NO_GLOBAL, heads)
    return write_folder(folder, lambda tmp: fill_folder(tmp, export))
