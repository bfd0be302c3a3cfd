"""The Ditto-MMD Synthetic generator (two-layer FedProx Synthetic(alpha, beta)): determinism, the generative
model, and that the heterogeneity level changes the clients' feature distributions. Small sample counts only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.data.registry import DATASETS, LoadContext
from fedhet.data.synthetic import (
    SYNTHETIC_LEVELS,
    SyntheticSpec,
    client_input_mean,
    generate_client,
    input_covariance_diag,
)


def small(level: float, seed: int = 7, n: int = 400) -> SyntheticSpec:
    return SyntheticSpec(alpha=level, beta=level, num_clients=8, samples_per_client=n, seed=seed)


def test_deterministic_in_the_seed() -> None:
    spec = small(0.5)
    x1, y1 = generate_client(spec, 3)
    generate_client.cache_clear()
    x2, y2 = generate_client(spec, 3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x3, _ = generate_client(small(0.5, seed=8), 3)
    assert not torch.equal(x1, x3)
    assert not torch.equal(x1, generate_client(spec, 4)[0])  # clients differ
    assert x1.shape == (400, 60) and x1.dtype == torch.float32 and y1.dtype == torch.int64
    assert int(y1.min()) >= 0 and int(y1.max()) < 10


def test_inputs_follow_n_v_sigma() -> None:
    spec = small(0.5, n=4000)
    x, _ = generate_client(spec, 0)
    v = client_input_mean(spec, 0)
    var = input_covariance_diag(60)
    assert np.isclose(var[0], 1.0) and np.isclose(var[9], 10 ** -1.2)
    z = (x.numpy().astype(np.float64) - v) / np.sqrt(var)  # standardised: ~ N(0, 1) per coordinate
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01


def test_heterogeneity_level_changes_the_feature_distributions() -> None:
    def spread(level: float) -> float:
        """Std over clients of the client-mean feature value: driven by B_k ~ N(0, beta^2)."""
        spec = SyntheticSpec(alpha=level, beta=level, num_clients=40, samples_per_client=50, seed=3)
        return float(np.std([generate_client(spec, k)[0].mean().item() for k in range(40)]))

    low, high = spread(0.0), spread(0.5)
    assert high > 2.5 * low  # with beta = 0 the client means v_k ~ N(0, 1) per coordinate: spread ~ 1/sqrt(60)
    assert low == pytest.approx(1 / np.sqrt(60), rel=0.5) and high == pytest.approx(0.5, rel=0.5)
    x0, _ = generate_client(small(0.0), 0)
    x5, _ = generate_client(small(0.5), 0)
    assert not torch.equal(x0, x5)


def test_labels_come_from_the_two_layer_model() -> None:
    spec = small(0.0, n=300)
    x, y = generate_client(spec, 2)
    rng = np.random.default_rng([spec.seed, 2])  # replay the client's draws in the documented order
    b_k = rng.normal(0.0, spec.beta)
    rng.normal(b_k, 1.0, 60)
    u1, u2 = rng.normal(0.0, spec.alpha, 2)
    w1, b1 = rng.normal(u1, 1.0, (20, 60)), rng.normal(u1, 1.0, 20)
    w2, b2 = rng.normal(u2, 1.0, (10, 20)), rng.normal(u2, 1.0, 10)
    logits = ((x.double().numpy() @ w1.T + b1) / 2.0) @ w2.T + b2
    assert (np.argmax(logits, axis=1) == y.numpy()).mean() > 0.99  # float32 rounding may flip near-ties


def test_registered_levels() -> None:
    import fedhet.data.synthetic  # noqa: F401  (registration)

    for name, level in SYNTHETIC_LEVELS.items():
        spec = DATASETS.get(name)
        assert spec.modality == "features" and spec.feature_dim == 60 and len(spec.classes) == 10
        assert spec.domains == tuple(f"client{k}" for k in range(8))
        d = spec.loader(LoadContext(root=None, image_size=0), "client1")
        assert d.x_train.shape == (5000, 60) and d.generated and not d.has_test
        assert torch.equal(d.x_train, generate_client(SyntheticSpec(level, level), 1)[0])
