"""FedPop's per-client score and hyperparameters in one fit (docs/design_fedpop_runner.md, S2): `fit_client(...,
check=split)` reports the locally trained model's loss on that split without changing the training or any later
random draw; the in-process runtime runs a client with its own copy of the method and can ask for that check."""

from __future__ import annotations

import dataclasses

import torch

from fedhet.algorithms.base import with_hparams
from fedhet.config import load_config
from fedhet.engine.evaluation import evaluate
from fedhet.engine.experiment import build_experiment
from fedhet.engine.local import fit_client
from fedhet.runtimes.inprocess import InProcessClients

BASE = ["data.dataset=offline_digits", "data.val_fraction=0.2", "model.name=mlp", "train.local_steps=3",
        "run.num_threads=1", "run.quiet=true"]


def fit(exp, check):
    alg = exp.algorithm
    torch.manual_seed(7)
    reply, _ = fit_client(alg, alg.broadcast(alg.init_server(), exp.round_info(1), 0), alg.init_client(0),
                          exp.context(0, 1), check=check)
    return reply, torch.rand(3)  # the next draw of the global RNG


def test_the_check_reports_the_trained_model_and_changes_nothing_else() -> None:
    exp = build_experiment(load_config(None, BASE))
    val = exp.data.clients[0].val
    assert val is not None and len(val) > 0
    plain, after_plain = fit(exp, None)
    checked, after_checked = fit(exp, val)
    assert all(torch.equal(plain.arrays[k], checked.arrays[k]) for k in plain.arrays)
    assert torch.equal(after_plain, after_checked)
    assert "check_loss" not in plain.scalars
    model = exp.algorithm.parts.new()
    model.load_state_dict(checked.arrays)  # FedAvg replies with the whole trained model
    want = evaluate(model, val, exp.context(0, 1).device, batch_size=exp.config.train.batch_size)
    assert checked.scalars["check_loss"] == want["loss"] and checked.scalars["check_accuracy"] == want["accuracy"]


def test_in_process_clients_use_their_own_copy_and_report_the_check() -> None:
    exp = build_experiment(load_config(None, BASE))
    alg, clients = exp.algorithm, InProcessClients(exp)
    messages = {cid: alg.broadcast(alg.init_server(), exp.round_info(1), cid) for cid in (0, 1)}
    plain = clients.fit(1, messages)
    clients.check_split = "val"
    faster = with_hparams(alg, train=dataclasses.replace(exp.config.train, lr=0.5))
    mixed = clients.fit(1, messages, algorithms={1: faster})
    assert all("check_loss" in r.message.scalars for r in mixed)
    same, other = (any(not torch.equal(a.message.arrays[k], b.message.arrays[k]) for k in a.message.arrays)
                   for a, b in zip(plain, mixed, strict=True))
    assert not same and other  # client 0 as before, client 1 trained with lr 0.5
