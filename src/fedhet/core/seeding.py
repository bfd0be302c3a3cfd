"""Every random choice derives from (run seed, round, client, purpose): `derive_seed` and `seeded`."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed from the run seed and any keys (round, client id, purpose); stable across processes."""
    text = ":".join(str(k) for k in (seed, *keys))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A numpy Generator for (seed, *keys)."""
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU torch.Generator for (seed, *keys), e.g. for DataLoader shuffling."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, *keys))
    return gen


def _seed_torch(value: int) -> None:
    """`torch.manual_seed(value)` for the devices fedhet runs on (CPU, CUDA, MPS), without its lazy seeding of
    devices that are not initialised (torch 2.x records a stack trace per call for those: ~2 ms, which a batched
    round of 64 small clients pays 64 times)."""
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(value)
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(value)


@contextmanager
def rngs_kept() -> Iterator[None]:
    """Save the global RNG states (torch, CUDA, numpy, random) and restore them after the block."""
    state = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(state[0])
        np.random.set_state(state[1])
        random.setstate(state[2])
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)


def reseed(seed: int, *keys: int | str) -> None:
    """Seed torch / numpy / random global RNGs from (seed, *keys), saving nothing: every generator `seeded` keeps
    is set afresh, so what runs next does not depend on what ran before. Inside one `rngs_kept` block, clients
    run one after another each from `reseed` draw what each would draw in its own `seeded` block (numpy's
    get_state / set_state alone cost ~0.3 ms a client: issue 42)."""
    value = derive_seed(seed, *keys)
    _seed_torch(value)
    np.random.seed(value % (2**32))
    random.seed(value)


@contextmanager
def seeded(seed: int, *keys: int | str) -> Iterator[None]:
    """Seed torch / numpy / random global RNGs from (seed, *keys) for the block, then restore them.

    Restoring keeps one client's randomness from leaking into the next, so a round's result does not
    depend on the order in which clients run (or on which runtime runs them).
    """
    with rngs_kept():
        reseed(seed, *keys)
        yield


FIT, EVALUATE, FINETUNE = "fit", "evaluate", "finetune"  # FINETUNE: FedPop's finetuned accuracy


def client_stream(seed: int, rnd: int, client_id: int, purpose: str) -> tuple[int, int, int, str]:
    """The keys of one client's random stream in a round: (run seed, round, client, FIT | EVALUATE). Every
    runtime seeds a client's fit / evaluation from these, so they draw the same numbers."""
    return seed, rnd, client_id, purpose
