"""Seeding: derived seeds are stable and `seeded` restores the global RNG state."""

from __future__ import annotations

import torch

from fedhet.core.seeding import derive_seed, seeded
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
