"""Novel clients (AdaptFED Sec. 4.2.6, spec §2.8): clients held out of training, then adapted as new sites.

`held_out` picks them (a seeded share, or by name); the round loop never samples them and leaves them out of
the training-time averages. After training, `adapt_novel` gives each one the trained server state and trains
only `part` of its model on its own training split, one epoch at a time, evaluating its test split before
the first epoch and after every epoch. What a part means is the method's: `Algorithm.novel_model` builds it
(AdaptFED: z_new alone, or the hypernetwork too); otherwise the client's deployed model with its personal
parameters ("personal") or all of them ("all") trainable. Results go to novel.json in the run directory, one
entry per part (and per novel.lr when one is given), so `fedhet adapt RUN novel.part=...` adds another.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tqdm.auto import tqdm

from fedhet.atomic import atomic_write_text, strict_json
from fedhet.config import NovelConfig
from fedhet.core.contract import LocalPass, NovelModel, OptimSpec, ServerState, minimize
from fedhet.core.params import OptimState
from fedhet.core.seeding import numpy_rng, seeded
from fedhet.engine.evaluation import evaluate
from fedhet.engine.experiment import Experiment
from fedhet.engine.local import deployed_model, run_pass
from fedhet.errors import ConfigError
from fedhet.losses.classification import cross_entropy
from fedhet.report.novel import NOVEL_FILE
from fedhet.yaml_input import JSONDict


def held_out(cfg: NovelConfig, names: list[str], seed: int) -> list[int]:
    """Sorted ids of the held-out clients: `cfg.clients` by name, or round(holdout x n) drawn from the seed (at
    least one, and at least one client left to train)."""
    if not cfg.active:
        return []
    if cfg.clients:
        unknown = [c for c in cfg.clients if c not in names]
        if unknown:
            raise ConfigError(f"novel.clients names unknown clients {unknown}; the clients are {', '.join(names)}")
        ids = sorted(names.index(c) for c in cfg.clients)
    else:
        k = max(1, round(cfg.holdout * len(names)))
        ids = sorted(int(i) for i in numpy_rng(seed, "novel").choice(len(names), size=k, replace=False))
    if len(ids) >= len(names):
        raise ConfigError("novel: every client is held out, none would train; hold out fewer")
    return ids


def generic_novel_model(exp: Experiment, server: ServerState, client_id: int, part: str) -> NovelModel:
    """The client's deployed model (its state fresh from `init_client`), with `part` trainable."""
    alg, rounds = exp.algorithm, exp.config.rounds
    msg = alg.broadcast(server, exp.round_info(rounds), client_id)
    model, _ = deployed_model(alg, msg, alg.init_client(client_id), exp.context(client_id, rounds))
    named = dict(model.named_parameters())
    if part == "all":
        return NovelModel(model, list(named.values()), "all")
    local = alg.parts.local_keys()
    params = [p for n, p in named.items() if n in local]
    if part != "personal" or not params:
        raise ConfigError(f"novel.part={part}: method {alg.name} has no such part (it keeps "
                          f"{'no parameters local' if not params else 'no hypernetwork'}); use novel.part=all")
    return NovelModel(model, params, "personal")


def novel_model(exp: Experiment, server: ServerState, client_id: int, part: str, trained: list[int]) -> NovelModel:
    """The method's own novel-client model when it has one for `part`, else the generic one ("auto": personal
    parameters of a personalized method that keeps some, else all)."""
    own = exp.algorithm.novel_model(server, exp.context(client_id, exp.config.rounds), part, trained)
    if own is not None:
        return own
    if part != "auto":
        return generic_novel_model(exp, server, client_id, part)
    try:
        return generic_novel_model(exp, server, client_id, "personal" if exp.algorithm.personalized else "all")
    except ConfigError:
        return generic_novel_model(exp, server, client_id, "all")


def epochs_to_reach(accuracies: list[float], reach: float) -> int:
    """The first epoch (0 = before adapting) whose accuracy is >= reach x the best of the adaptation."""
    target = reach * max(accuracies)
    return next(e for e, a in enumerate(accuracies) if a >= target)


def train_novel(exp: Experiment, novel: NovelModel, client_id: int, cfg: NovelConfig) -> list[float]:
    """Train `novel.params` on the client's training split for cfg.epochs epochs (one optimizer throughout,
    seeded batches); its test accuracy before the first epoch and after each."""
    model, data, device = novel.module.to(exp.device), exp.data.clients[client_id], exp.device
    train = dataclasses.replace(exp.config.train, local_epochs=1, local_steps=None)
    spec = OptimSpec.from_train(novel.params, train, cfg.lr, persist=True)
    frozen = [p for p in model.parameters() if all(p is not q for q in novel.params)]
    step = LocalPass("novel", minimize(lambda x, y: cross_entropy(model, x, y)), {"model": spec}, train,
                     modules=(model,), frozen=frozen)
    accuracies = [evaluate(model, data.test, device)["accuracy"]]
    saved: dict[str, OptimState] = {}
    for epoch in range(1, cfg.epochs + 1):
        with seeded(exp.config.seed, "novel", client_id, epoch):
            _, saved = run_pass(step, saved, f"novel client {data.name} epoch {epoch}", data.train, device)
        accuracies.append(evaluate(model, data.test, device)["accuracy"])
    return accuracies


def adapt_client(exp: Experiment, server: ServerState, client_id: int, cfg: NovelConfig, trained: list[int]
                 ) -> JSONDict:
    """Adapt one held-out client: its accuracy per epoch, best, final and epochs to reach."""
    novel = novel_model(exp, server, client_id, cfg.part, trained)
    return client_row(exp.data.clients[client_id].name, novel, train_novel(exp, novel, client_id, cfg), cfg.reach)


def client_row(name: str, novel: NovelModel, accuracies: list[float], reach: float) -> JSONDict:
    """One adapted client's novel.json row: accuracy per epoch, best, final and epochs to reach."""
    return {"client": name, "part": novel.part, "trainable_params": sum(p.numel() for p in novel.params),
            "accuracy": accuracies, "final": accuracies[-1], "best": max(accuracies),
            "epochs_to_reach": epochs_to_reach(accuracies, reach)}


def summarize(rows: list[JSONDict], cfg: NovelConfig, default_lr: float) -> JSONDict:
    """The novel.json entry of adapted clients: the settings, their rows and the means over them."""
    n = len(rows)
    return {"part": rows[0]["part"], "epochs": cfg.epochs, "lr": cfg.lr or default_lr, "reach": cfg.reach,
            "clients": rows, "mean_final": sum(r["final"] for r in rows) / n,
            "mean_best": sum(r["best"] for r in rows) / n,
            "mean_epochs_to_reach": sum(r["epochs_to_reach"] for r in rows) / n,
            "mean_accuracy": [sum(r["accuracy"][e] for r in rows) / n for e in range(cfg.epochs + 1)]}


def merge_novel(run_dir: Path, key: str, result: JSONDict) -> None:
    """Add (or replace) entry `key` of run_dir/novel.json, atomically; the other entries stay."""
    path = run_dir / NOVEL_FILE
    existing = json.loads(path.read_text()) if path.is_file() else {}
    atomic_write_text(path, strict_json({**existing, key: result}, indent=1))


def adapt_novel(exp: Experiment, server: ServerState, run_dir: Path, progress: bool = True) -> JSONDict:
    """Adapt every held-out client (`exp.arrangement.novel`); merge the result into run_dir/novel.json under its
    part, and return it."""
    cfg = exp.config.novel
    trained = exp.arrangement.pool(len(exp.data.clients))
    rows = [adapt_client(exp, server, cid, cfg, trained)
            for cid in tqdm(exp.arrangement.novel, desc="novel clients", disable=not progress, unit="client")]
    result = summarize(rows, cfg, exp.config.train.lr)
    key = result["part"] if cfg.lr is None else f"{result['part']}@lr={cfg.lr:g}"  # another lr: another entry
    merge_novel(run_dir, key, result)
    return result
