"""Membership inference on any run: each client's deployed model, its training split as members, its test split
as non-members (FedBiP spec §2.7 (iii): "[inference] Members are the clients' real training images;
non-members are held-out images"). Results go to privacy.json in the run directory.

The model attacked is exactly the one the run evaluated at its checkpoint's round: the server state and client
states from checkpoints/latest.pt, `Algorithm.broadcast` to the client (the state of the training client it
deploys, e.g. the one pooled model for the centralized oracle `all`), then `engine.local.deployed_model`
(including the deployment's own passes) under the same seed stream as the in-process evaluation, so the
non-members' mean loss equals the test loss in metrics.jsonl. Members are read with the evaluation transform
(`ClientData.train_eval`: the training images without augmentation). Clients held out of training
(`novel.holdout`) are left out: they never trained, so they have no members.

Per client a full report (`membership.membership_report`), then `avg` (the uniform mean over clients, as
fedhet's `avg` client) and `pooled` (every client's members against every client's non-members). `table4`
holds the paper's two numbers, the pooled loss gap and entropy gap: the paper computes "the average loss
and the average entropy of the final model on training-member and non-member data", which for FedBiP's and
FedAvg's single model is the average over all members and all non-members.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from tqdm.auto import tqdm

from fedhet.atomic import atomic_write_text, strict_json
from fedhet.config import load_config
from fedhet.core.contract import ClientState, ServerState
from fedhet.core.protocols import SampleSet
from fedhet.core.seeding import EVALUATE, client_stream, seeded
from fedhet.data import ClientData
from fedhet.engine.checkpoint import load_checkpoint
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.local import deployed_model
from fedhet.engine.rundir import RunDirectory
from fedhet.errors import FedhetError
from fedhet.privacy.membership import average_reports, evaluate_membership, pooled_report
from fedhet.yaml_input import JSONDict

PRIVACY_FILE = "privacy.json"
SPLITS = {"train": "train_eval", "val": "val", "test": "test"}  # split name -> ClientData attribute


def client_split(client: ClientData, split: str) -> SampleSet:
    """The client's `split` ("train": the training samples with the evaluation transform, "val", "test"), or a
    FedhetError naming the client when it has none or it is empty."""
    if split not in SPLITS:
        raise FedhetError(f"unknown split '{split}': choose one of {', '.join(SPLITS)}")
    data: SampleSet | None = getattr(client, SPLITS[split])
    if data is None or len(data) == 0:  # type: ignore[arg-type]
        hint = " (set data.val_fraction > 0 when running it)" if split == "val" else ""
        raise FedhetError(f"client '{client.name}' has no {split} split{hint}, so it has no "
                          f"{'members' if split == 'train' else 'samples'} to attack with; choose another split "
                          "with --split-members / --split-nonmembers")
    return data


def deployed_models(exp: Experiment, server: ServerState, states: Mapping[int, ClientState], rnd: int
                    ) -> Iterator[tuple[int, nn.Module, int]]:
    """(client id, deployed model, evaluation batch size) of every training client at round `rnd`, seeded as
    the in-process evaluation seeds them. A model may be a reused workspace: use it before taking the next."""
    alg, arrangement = exp.algorithm, exp.arrangement
    for cid in arrangement.pool(len(exp.data.clients)):
        owner = arrangement.state_of[cid]
        msg = alg.broadcast(server, exp.round_info(rnd), owner)
        with seeded(*client_stream(exp.config.seed, rnd, cid, EVALUATE)):
            model, batch_size = deployed_model(alg, msg, states[owner], exp.context(cid, rnd))
        yield cid, model, batch_size


def evaluate_experiment(exp: Experiment, server: ServerState, states: Mapping[int, ClientState], rnd: int,
                        members: str = "train", nonmembers: str = "test", progress: bool = False) -> JSONDict:
    """The membership report of every training client's deployed model (members: its `members` split,
    non-members: its `nonmembers` split), their average, the pooled report and Table 4's two gaps."""
    if members == nonmembers:
        raise FedhetError(f"members and non-members are both the {members} split; they must be different splits")
    pool = exp.arrangement.pool(len(exp.data.clients))
    splits = {cid: (client_split(exp.data.clients[cid], members), client_split(exp.data.clients[cid], nonmembers))
              for cid in pool}  # every split checked before any model is deployed
    clients, member_scores, nonmember_scores = {}, [], []
    models = deployed_models(exp, server, states, rnd)
    for cid, model, batch_size in tqdm(models, total=len(pool), desc="membership inference", unit="client",
                                       disable=not progress):
        client = exp.data.clients[cid]
        report, m, u = evaluate_membership(model, *splits[cid], exp.device, batch_size, client.classes)
        clients[client.name] = report
        member_scores.append(m)
        nonmember_scores.append(u)
    pooled = pooled_report(member_scores, nonmember_scores)
    held_out = [exp.data.clients[c].name for c in exp.arrangement.novel]
    return {"members": members, "nonmembers": nonmembers, "round": rnd, "clients": clients,
            "avg": average_reports(list(clients.values())), "pooled": pooled,
            "table4": {"entropy": pooled["entropy"]["gap"], "loss": pooled["loss"]["gap"]}, "held_out": held_out}


def check_run_dir(run_dir: Path) -> RunDirectory:
    """The run directory, or a FedhetError when it is not one or has no checkpoint to attack."""
    rundir = RunDirectory(run_dir)
    if not run_dir.is_dir() or not rundir.config_path.is_file():
        raise FedhetError(f"'{run_dir}' is not a fedhet run directory (no config.yaml there); give the folder "
                          "`fedhet run` printed as 'results:', runs/<name>/<dataset>/<method>/seed<k>")
    if not rundir.latest_checkpoint.is_file():
        raise FedhetError(f"'{run_dir}' has no checkpoint ({rundir.latest_checkpoint}), so there is no trained "
                          "model to attack; finish or resume the run first (fedhet run CONFIG --resume)")
    return rundir


def load_states(rundir: RunDirectory, exp: Experiment) -> tuple[ServerState, dict[int, ClientState], int]:
    """The checkpoint's server state, client states and round (checked against the run's config)."""
    payload = load_checkpoint(rundir.latest_checkpoint, exp.config.to_dict())
    states = payload["clients"]
    if not isinstance(states, dict) or set(states) != set(range(len(exp.arrangement.train))):
        raise FedhetError(f"checkpoint '{rundir.latest_checkpoint}' holds no client state per training client; "
                          "membership inference needs the states of an in-process or batched run")
    return payload["server"], states, int(payload["round"])


def write_privacy(path: Path, result: JSONDict, key: str | None = None) -> None:
    """Merge `result` into path/privacy.json under `key` (default "<members>_vs_<nonmembers>"), atomically,
    keeping the other entries."""
    file = path / PRIVACY_FILE
    existing = json.loads(file.read_text()) if file.is_file() else {}
    key = key or f"{result['members']}_vs_{result['nonmembers']}"
    atomic_write_text(file, strict_json({**existing, key: result}, indent=1))


@dataclass
class AttackedRun:
    """An opened run: its directory, experiment, and the checkpoint's server state, client states and round."""

    rundir: RunDirectory
    exp: Experiment
    server: ServerState
    states: dict[int, ClientState]
    round: int

    def facts(self) -> JSONDict:
        """What every privacy.json entry says about the run."""
        cfg = self.exp.config
        return {"method": cfg.method, "label": cfg.variant, "dataset": cfg.data.dataset, "seed": cfg.seed,
                "rounds": cfg.rounds, "finished": self.rundir.is_finished()}


@contextmanager
def attacked_run(run_dir: str | Path) -> Iterator[AttackedRun]:
    """The run in `run_dir` at its latest checkpoint, locked for the block (another process may not train it
    meanwhile). Not a run directory, no checkpoint, a Flower run: one FedhetError each."""
    rundir = check_run_dir(Path(run_dir))
    cfg = load_config(rundir.config_path)
    if cfg.run.runtime.startswith("flower"):
        raise FedhetError(f"'{run_dir}' is a Flower run ({cfg.run.runtime}): its client states stay on the nodes, "
                          "so its deployed models cannot be rebuilt here; run it in-process to attack it")
    with rundir.locked():
        exp = build_experiment(cfg)
        server, states, rnd = load_states(rundir, exp)
        yield AttackedRun(rundir, exp, server, states, rnd)


def evaluate_run(run_dir: str | Path, members: str = "train", nonmembers: str = "test", progress: bool = True,
                 write: bool = True) -> JSONDict:
    """Membership inference on the run in `run_dir` at its latest checkpoint (module docstring); with `write`,
    the result is merged into run_dir/privacy.json. Bad input is one FedhetError, before anything is written."""
    check_run_dir(Path(run_dir))
    if members == nonmembers or {members, nonmembers} - set(SPLITS):
        raise FedhetError(f"--split-members {members} --split-nonmembers {nonmembers}: give two different splits "
                          f"among {', '.join(SPLITS)}")
    with attacked_run(run_dir) as run:
        quiet = run.exp.config.run.quiet
        result = evaluate_experiment(run.exp, run.server, run.states, run.round, members, nonmembers,
                                     progress and not quiet)
        result.update(run.facts())
        if write:
            write_privacy(run.rundir.path, result)
    return result
