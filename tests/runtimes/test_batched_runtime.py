"""`run.runtime: batched` gives the in-process runtime's per-client metrics (offline_digits, small_cnn width 8).

Augmentation is off except in one case (per-sample torchvision transforms are most of the run time here; the
augmented case checks that the augmentation randomness is reproduced too).
Tolerances (CPU, one torch thread, same config and seed; data order and augmentation are identical):
- models without BatchNorm: every test loss within 1e-5 and every accuracy equal (observed: <= 3e-7, most rows
  bit-identical); vmap's batching rules change float rounding only;
- with BatchNorm: loss within 1e-4, accuracy within one test example (observed: 2e-7). One vectorized step
  agrees with one in-process step to ~1e-6, but this model/data is chaotic under training with BatchNorm:
  in-process, a random 1e-6 perturbation of the global model changes the next round's weights by up to 3e-2
  (FedBN, 3 steps of lr 0.1), and exact ties (max-pool windows on the constant background of un-noised digits)
  turn rounding differences into different gradient routes. So BatchNorm runs are compared over 2 rounds of
  2 steps, with input noise (data.input_noise_std) that removes the ties.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from fedhet_testing import for_method, metric_rows

from fedhet.algorithms import ALGORITHMS
from fedhet.algorithms.base import with_hparams
from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.errors import CheckpointError, ConfigError
from fedhet.launch.run import make_executor, run_experiment
from fedhet.runtimes.batched import BatchedClients
from fedhet.runtimes.inprocess import InProcessClients

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8, norm: none}",
        "train.local_steps=3", "train.batch_size=16", "train.lr=0.1", "data.max_test_per_client=20",
        "run.quiet=true", "run.device=cpu", "run.num_threads=1", "rounds=2", "data.augment=false",
        "run.batched_min_lanes=1"]  # every group as lanes, however small (what these tests compare)
BN = ["model.args={width: 8}", "data.input_noise_std=0.1", "train.local_steps=2"]
RAGGED = ["data.partition=dirichlet", "data.num_clients=5", "data.alpha=0.5", "data.fraction=0.15",
          "train.local_steps=null", "train.local_epochs=1"]


def rows(tmp: Path, *overrides: str) -> list[dict]:
    cfg = load_config(None, [*BASE, *overrides, f"run.out_dir={tmp}"])
    result = run_experiment(cfg, progress=False)
    return metric_rows(result.run_dir)


def assert_same(tmp_path: Path, *overrides: str, loss_tol: float = 1e-5, acc_tol: float = 0.0) -> list[dict]:
    """Run both runtimes; every (round, client, split) row must agree within the tolerances."""
    a = rows(tmp_path / "inprocess", *overrides)
    b = rows(tmp_path / "batched", *overrides, "run.runtime=batched")
    assert [(r["round"], r["client"], r["split"]) for r in a] == [(r["round"], r["client"], r["split"]) for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], abs=loss_tol), (ra, rb)
        assert abs(rb["accuracy"] - ra["accuracy"]) <= acc_tol + 1e-12, (ra, rb)
        assert abs(rb["balanced_accuracy"] - ra["balanced_accuracy"]) <= max(acc_tol * 4, 1e-12), (ra, rb)
    return b


@pytest.mark.parametrize("overrides", [
    ["method=fedavg"],
    ["method=fedavg", "data.augment=true", "rounds=1"],
    ["method=fedprox", "method_args={mu: 0.5}"],
    ["method=ditto", "method_args={lam: 0.5}"],
    ["method=ditto", "method_args={lam: 0.5, schedule: tandem}"],
    ["method=fedavg", "train.optimizer=adam", "train.lr=0.01", "train.weight_decay=0.01",
     "train.persist_optimizer=true"],
], ids=["fedavg", "fedavg-augmented", "fedprox", "ditto", "ditto-tandem", "fedavg-adam-persist"])
def test_matches_inprocess_without_batchnorm(tmp_path: Path, overrides: list[str]) -> None:
    assert_same(tmp_path, *overrides)


def test_clients_whose_work_differs_in_shape_train_in_separate_groups(tmp_path: Path) -> None:
    """MOON with half the clients sampled: in round 2 some clients have a previous model (two more module fields in
    their Work) and some do not; they are trained as two groups, each as in-process."""
    assert_same(tmp_path, "method=moon", "server.fraction_fit=0.5", "rounds=3")


def test_fedbn_matches_inprocess_with_batchnorm_per_client(tmp_path: Path) -> None:
    assert_same(tmp_path, "method=fedbn", *BN, loss_tol=1e-4, acc_tol=1 / 20)


def test_ragged_clients_are_grouped_not_dropped(tmp_path: Path) -> None:
    """Dirichlet clients of different sizes, one epoch each: different step counts and partial last batches
    (lanes grouped by batch size at every step)."""
    exp = build_experiment(load_config(None, [*BASE, *RAGGED]))
    sizes = [c.num_train for c in exp.data.clients]
    assert len({-(-n // 16) for n in sizes}) > 1 and any(n % 16 for n in sizes)  # the case is really ragged
    assert_same(tmp_path, "method=fedprox", "train.grad_clip=1.0", "train.momentum=0.5", *RAGGED)
    assert_same(tmp_path / "ditto", "method=ditto", "method_args={lam: 0.1, personal_epochs: 2}", *RAGGED)


def test_ragged_clients_with_batchnorm(tmp_path: Path) -> None:
    assert_same(tmp_path, "method=fedbn", *BN, *RAGGED, loss_tol=1e-4, acc_tol=1 / 20)


def test_fit_replies_and_states_match_inprocess() -> None:
    """One round of fit: replies (arrays, scalars) and client states (FedBN's local BN) as in-process."""
    exp = build_experiment(load_config(None, [*BASE, *BN, "method=fedbn", "train.persist_optimizer=true"]))
    alg = exp.algorithm
    server = alg.init_server()
    messages = {cid: alg.broadcast(server, exp.round_info(1), cid) for cid in (2, 0, 3)}  # sampled order is kept
    seq, vec = InProcessClients(exp), BatchedClients(exp)
    want, got = seq.fit(1, messages), vec.fit(1, messages)
    assert [r.client_id for r in got] == [2, 0, 3]
    for a, b in zip(want, got, strict=True):
        assert a.num_examples == b.num_examples and a.message.scalars["steps"] == b.message.scalars["steps"]
        assert b.message.scalars["train_loss"] == pytest.approx(a.message.scalars["train_loss"], abs=1e-5)
        assert set(a.message.arrays) == set(b.message.arrays)
        for k, v in a.message.arrays.items():
            assert torch.allclose(b.message.arrays[k].double(), v.double(), atol=1e-5), k
    for cid in messages:
        local_a, local_b = seq.states[cid].local, vec.states[cid].local
        assert set(local_a) == set(local_b) and any("running_mean" in k for k in local_a)
        for k in local_a:
            assert torch.allclose(local_b[k].double(), local_a[k].double(), atol=1e-5), (cid, k)
        assert set(seq.states[cid].optim["model"]["state"]) == set(vec.states[cid].optim["model"]["state"])
    assert vec.states[1] == alg.init_client(1)  # not sampled: untouched


def test_chunking_gives_the_same_result(tmp_path: Path) -> None:
    """4 clients in chunks of 3 + 1 (and a memory budget that forces 1 per chunk) = all 4 at once (to float
    rounding: vmap's kernels see another number of lanes)."""
    whole = rows(tmp_path / "whole", "method=ditto", "run.runtime=batched")
    for name, limit in (("max3", "run.batched_max_clients=3"), ("mem", "run.batched_memory_mb=0.001")):
        chunked = rows(tmp_path / name, "method=ditto", "run.runtime=batched", limit)
        for ra, rb in zip(whole, chunked, strict=True):
            assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-6) and rb["accuracy"] == ra["accuracy"], (ra, rb)


def test_chunk_size_follows_the_budget() -> None:
    exp = build_experiment(load_config(None, [*BASE, *BN, "run.runtime=batched", "run.batched_memory_mb=0.001"]))
    assert BatchedClients(exp).chunk_size == 1
    exp = build_experiment(load_config(None, [*BASE, *BN, "run.runtime=batched", "run.batched_max_clients=2"]))
    assert BatchedClients(exp).chunk_size == 2


@pytest.mark.parametrize(("method", "rule"), [("scaffold", 2), ("fraug", 1), ("ditto_mmd", 5), ("fedproto", 7),
                                             ("embnoise", 7)])
def test_methods_breaking_the_rule_raise_naming_it_and_the_inprocess_runtime(method: str, rule: int) -> None:
    """Refused by a rule, before training: SCAFFOLD edits gradients (after_backward), FRAug steps with its own
    function, Ditto+MMD's loss reads its per-client kernel session, FedProto branches on a tensor, and
    embedding noise draws random numbers inside the loss."""
    exp = build_experiment(load_config(None, [*BASE, f"method={method}", "run.runtime=batched"]))
    with pytest.raises(ConfigError, match=rf"method '{method}' cannot run on run.runtime=batched: .*\(rule {rule}\)"
                                          r".*run.runtime=inprocess"):
        make_executor(exp)


@pytest.mark.parametrize("method", ALGORITHMS.names())
def test_every_method_the_rule_accepts_matches_inprocess(tmp_path: Path, method: str) -> None:
    """The rule is sound: whatever registered method it lets through trains as in-process (2 rounds, no BatchNorm,
    tight tolerance; a method that needs BatchNorm gets the BN model); the others are refused with the one error.
    No method is named: a new method is covered by being registered."""
    bn = False
    try:
        overrides = for_method(method, [])
        exp = build_experiment(load_config(None, [*BASE, *overrides, "run.runtime=batched"]))
    except ConfigError:  # FedBN needs BatchNorm
        bn, overrides = True, [f"method={method}", *BN]
        exp = build_experiment(load_config(None, [*BASE, *overrides, "run.runtime=batched"]))
    try:
        make_executor(exp)
    except ConfigError as e:
        assert re.search(r"cannot run on run.runtime=batched: .*\(rule \d\).*run.runtime=inprocess", str(e)), e
        return
    if not bn:
        assert_same(tmp_path, *overrides)
    else:
        assert_same(tmp_path, *overrides, loss_tol=1e-4, acc_tol=1 / 20)


def test_runtime_is_selected_by_config(tmp_path: Path) -> None:
    exp = build_experiment(load_config(None, [*BASE, "run.runtime=batched"]))
    assert isinstance(make_executor(exp), BatchedClients)
    exp = build_experiment(load_config(None, BASE))
    assert type(make_executor(exp)) is InProcessClients
    with pytest.raises(ConfigError, match="batched_max_clients"):
        load_config(None, [*BASE, "run.batched_max_clients=0"])
    with pytest.raises(ConfigError, match="batched_min_lanes"):
        load_config(None, [*BASE, "run.batched_min_lanes=0"])


@pytest.mark.parametrize("min_lanes", [1, 3, 100])
def test_groups_smaller_than_min_lanes_train_one_after_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               min_lanes: int) -> None:
    """Jobs are grouped by batch size; a group below run.batched_min_lanes runs the in-process code (the very
    same numbers as in-process), a larger one as lanes; outcomes come back in the jobs' order."""
    exp = build_experiment(load_config(None, [*BASE, "method=fedprox", "method_args={mu: 0.5}", "run.runtime=batched",
                                              f"run.batched_min_lanes={min_lanes}"]))
    lanes, seq = make_executor(exp), InProcessClients(exp)
    assert isinstance(lanes, BatchedClients) and lanes.policy.floor == min_lanes
    alg = exp.algorithm
    copies = {cid: with_hparams(alg, dataclasses.replace(alg.train_cfg, batch_size=8 if cid % 2 else 16))
              for cid in range(4)}  # two groups of two
    msgs = {cid: alg.broadcast(alg.init_server(), exp.round_info(1), cid) for cid in range(4)}
    laned: list[int] = []
    chunk = lanes._fit_chunk
    monkeypatch.setattr(lanes, "_fit_chunk",
                        lambda rnd, jobs, rows=None: (laned.extend(j.cid for j in jobs), chunk(rnd, jobs, rows))[1])
    got, want = lanes.fit(1, msgs, copies), seq.fit(1, msgs, copies)
    assert sorted(laned) == ([0, 1, 2, 3] if min_lanes <= 2 else [])
    assert [r.client_id for r in got] == [r.client_id for r in want] == [0, 1, 2, 3]
    for a, b in zip(got, want, strict=True):
        for k, v in b.message.arrays.items():
            if min_lanes > 2:
                assert torch.equal(a.message.arrays[k], v)  # the in-process code: bitwise
            else:
                assert torch.allclose(a.message.arrays[k], v, atol=1e-6)


def test_checkpointed_states_move_between_runtimes(tmp_path: Path) -> None:
    """Stop a batched Ditto run after round 1, resume it in-process: refused unless the runtime change is allowed
    (the runtimes agree only to float tolerance), and then the same rows as a batched run throughout."""
    args = ["method=ditto", "rounds=2", "train.persist_optimizer=true"]
    full = rows(tmp_path / "full", *args, "run.runtime=batched")
    cfg = load_config(None, [*BASE, *args, "run.runtime=batched", f"run.out_dir={tmp_path / 'split'}"])
    run_experiment(cfg, stop_after=1, progress=False)
    cfg = load_config(None, [*BASE, *args, f"run.out_dir={tmp_path / 'split'}"])
    with pytest.raises(CheckpointError, match="run.runtime: 'batched' in the checkpoint, 'sequential' now"):
        run_experiment(cfg, resume=True, progress=False)
    result = run_experiment(cfg, resume=True, progress=False, allow_changes=("run.runtime",))
    resumed = metric_rows(result.run_dir)
    for ra, rb in zip(full, resumed, strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-5) and rb["accuracy"] == ra["accuracy"], (ra, rb)
