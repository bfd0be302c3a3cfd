"""Seeding: derived seeds are stable and `seeded` restores the global RNG state."""

from __future__ import annotations

import random

import numpy as np
import torch

from fedhet.core.seeding import derive_seed, reseed, rngs_kept, seeded
from fedhet.engine.sampling import sample_clients


def test_derive_seed_stable_and_distinct() -> None:
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    assert derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    assert derive_seed(0, 1, 2) != derive_seed(1, 1, 2)


def test_seeded_block_is_reproducible_and_restores_state() -> None:
    torch.manual_seed(123)
    with seeded(7, 3, "fit"):
        a = torch.rand(3)
    after = torch.rand(1)
    torch.manual_seed(123)
    with seeded(7, 3, "fit"):
        b = torch.rand(3)
    assert torch.equal(a, b)
    assert torch.equal(after, torch.rand(1))


def draws() -> tuple[torch.Tensor, np.ndarray, float, float]:
    """Odd counts of Gaussians: each generator is left with a cached second Gaussian (torch, numpy, random)."""
    return torch.randn(3), np.random.randn(3), random.gauss(0, 1), random.random()


def caller_draws() -> tuple[torch.Tensor, float, float]:
    return torch.rand(2), np.random.rand(), random.random()


def test_clients_reseeded_in_one_kept_block_draw_as_in_their_own_seeded_blocks() -> None:
    """The in-process runtime saves the RNGs once per round and reseeds each client (issue 42): the same draws as
    a `seeded` block per client, and the caller's generators as they were."""
    want = []
    for cid in (1, 2):
        with seeded(0, 1, cid, "fit"):
            want.append(draws())
    for gen in (torch.manual_seed, np.random.seed, random.seed):
        gen(5)
    want_after = caller_draws()  # the caller's next draws, no client in between
    for gen in (torch.manual_seed, np.random.seed, random.seed):
        gen(5)
    got = []
    with rngs_kept():
        for cid in (1, 2):
            reseed(0, 1, cid, "fit")
            got.append(draws())
    for (a, b, c, d), (e, f, g, h) in zip(want, got, strict=True):
        assert torch.equal(a, e) and np.array_equal(b, f) and (c, d) == (g, h)
    after = caller_draws()
    assert torch.equal(after[0], want_after[0]) and after[1:] == want_after[1:]


def test_client_sampling() -> None:
    assert sample_clients(0, 1, 5, 1.0) == [0, 1, 2, 3, 4]
    picked = sample_clients(0, 1, 10, 0.3)
    assert len(picked) == 3 and picked == sample_clients(0, 1, 10, 0.3)
    assert any(sample_clients(0, r, 10, 0.3) != picked for r in range(2, 6))


def test_limit_threads_caps_torch_and_blas() -> None:
    """run.num_threads caps torch AND the BLAS pools (a 2-thread OpenBLAS made each tiny scipy solve cost ms)."""
    from threadpoolctl import threadpool_info

    from fedhet.engine.experiment import limit_threads

    before = torch.get_num_threads()
    blas = limit_threads(1)
    try:
        assert torch.get_num_threads() == 1
        assert all(p["num_threads"] == 1 for p in threadpool_info() if p["user_api"] == "blas")
    finally:
        torch.set_num_threads(before)
        blas.restore_original_limits()


def test_in_process_fit_and_evaluate_seed_each_client_and_restore_the_caller() -> None:
    """A client's reply and metrics do not depend on the clients before it in the round (each is reseeded inside
    the round's one `rngs_kept` block), and the caller's RNG is as it was."""
    from fedhet.config import load_config
    from fedhet.engine.experiment import build_experiment
    from fedhet.runtimes.inprocess import InProcessClients

    exp = build_experiment(load_config(None, ["data.dataset=offline_digits", "model.name=mlp", "train.local_steps=2",
                                              "model.args={dropout: 0.5}", "run.num_threads=1", "run.quiet=true"]))
    alg = exp.algorithm
    msgs = {cid: alg.broadcast(alg.init_server(), exp.round_info(1), cid) for cid in (0, 1)}
    torch.manual_seed(3)
    both, after = InProcessClients(exp).fit(1, msgs), torch.rand(2)
    alone = InProcessClients(exp).fit(1, {1: msgs[1]})
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(2))
    assert all(torch.equal(both[1].message.arrays[k], v) for k, v in alone[0].message.arrays.items())
    assert both[1].message.scalars == alone[0].message.scalars
    clients = InProcessClients(exp)
    assert clients.evaluate(1, msgs, "test")[exp.data.clients[1].name] == clients.evaluate(1, {1: msgs[1]}, "test")[
        exp.data.clients[1].name]
