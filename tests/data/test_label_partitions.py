"""The AdaptFED paper's label-skew partitions: pFedHN's U(0.4, 0.6) pathological split, the Dirichlet sweep and
two-stage Pachinko (fedhet.data.label_skew, fedhet.data.partition), on synthetic labels; the wiring on
offline_digits."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.config import DataConfig
from fedhet.data import build_federated_data
from fedhet.data import label_skew as L
from fedhet.data import partition as P
from fedhet.errors import ConfigError


def _labels(num_classes: int, per_class: int) -> np.ndarray:
    return np.random.default_rng(99).permutation(np.repeat(np.arange(num_classes), per_class))


def _counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


# ---- pathological (pFedHN / FedTP `noniid-labeluni`) ----

@pytest.mark.parametrize(("clients", "k"), [(20, 2), (7, 3)])
def test_pathological_rates_classes_and_balance(clients: int, k: int) -> None:
    rates = L.uniform_class_rates(10, clients, k, np.random.default_rng(5))
    held = rates > 0
    assert (held.sum(axis=1) == k).all()  # k distinct classes per client
    assert rates[held].min() >= 0.4 and rates[held].max() <= 0.6  # a_ic ~ U(0.4, 0.6) before normalising
    assert rates[held].min() < 0.45 and rates[held].max() > 0.55  # drawn, not a constant share
    holders = held.sum(axis=0)
    assert holders.max() - holders.min() <= 1 and holders.sum() == clients * k  # classes evenly used


def test_pathological_shares_are_rates_normalised_over_holders() -> None:
    y = _labels(10, 200)
    parts = L.pathological_uniform_partition(y, 20, 2, np.random.default_rng(3))
    rates = L.uniform_class_rates(10, 20, 2, np.random.default_rng(3))  # the same first draws as inside
    counts = _counts(y, parts, 10)
    expected = 200 * rates / rates.sum(axis=0, keepdims=True)
    assert np.abs(counts - expected).max() < 1.0  # largest remainder: within one sample
    assert ((counts > 0).sum(axis=1) == 2).all() and counts.sum() == len(y)
    assert len(np.unique(np.concatenate(parts))) == len(y)  # disjoint, nothing dropped


def test_pathological_seeded_and_too_many_clients() -> None:
    y = _labels(10, 50)
    a, b, c = (L.pathological_uniform_partition(y, 10, 2, np.random.default_rng(s)) for s in (1, 1, 2))
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert any(not np.array_equal(p, q) for p, q in zip(a, c, strict=True))
    with pytest.raises(ConfigError, match="fewer clients"):
        L.pathological_uniform_partition(_labels(4, 2), 12, 1, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="classes_per_client"):
        L.pathological_uniform_partition(y, 10, 11, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="pathological_low"):
        L.pathological_uniform_partition(y, 10, 2, np.random.default_rng(0), low=0.7, high=0.6)


# ---- Dirichlet (the paper's sweep) ----

def _mean_entropy(y: np.ndarray, alpha: float) -> float:
    out = []
    for seed in range(4):
        counts = _counts(y, P.dirichlet_partition(y, 10, alpha, np.random.default_rng(seed)), 10)
        p = counts / counts.sum(axis=1, keepdims=True)
        out.append(-(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1).mean())
    return float(np.mean(out))


def test_dirichlet_smaller_alpha_more_skew() -> None:
    y = _labels(10, 100)
    entropies = [_mean_entropy(y, a) for a in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert all(lo < hi for lo, hi in zip(entropies, entropies[1:], strict=False)), entropies
    assert entropies[0] < 0.6 * np.log(10) < entropies[-1] < np.log(10)


# ---- two-stage Pachinko ----

GROUP_OF = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3, 3])  # 4 coarse groups of sizes 3, 3, 2, 2


def test_pachinko_weights_follow_the_two_dirichlets() -> None:
    w = L.pachinko_weights(GROUP_OF, 400, 0.4, 10.0, np.random.default_rng(0))
    simpson = (w.coarse**2).sum(axis=1).mean()  # E sum p^2 = (a + 1) / (G a + 1) under Dir(a 1_G)
    assert simpson == pytest.approx(1.4 / 2.6, abs=0.04)
    for g, size in ((0, 3), (2, 2)):
        fine = w.fine[:, GROUP_OF == g]
        assert np.allclose(fine.sum(axis=1), 1.0)  # a distribution within the group
        assert (fine**2).sum(axis=1).mean() == pytest.approx(11 / (10 * size + 1), abs=0.04)


def test_pachinko_samples_follow_each_clients_weights() -> None:
    y = _labels(10, 5000)
    w = L.pachinko_weights(GROUP_OF, 10, 0.4, 10.0, np.random.default_rng(1))
    parts = L.pachinko_sample(y, GROUP_OF, w, 1000, np.random.default_rng(2))
    counts = _counts(y, parts, 10)
    assert (counts.sum(axis=1) == 1000).all()
    for i in range(10):
        coarse = np.bincount(GROUP_OF, weights=counts[i], minlength=4) / 1000
        assert 0.5 * np.abs(coarse - w.coarse[i]).sum() < 0.06  # the client's coarse mix is its coarse draw
        for g in range(4):  # and within each group, its fine draw for that group
            members = GROUP_OF == g
            if counts[i, members].sum() >= 200:
                fine = counts[i, members] / counts[i, members].sum()
                assert 0.5 * np.abs(fine - w.fine[i, members]).sum() < 0.1


def test_pachinko_uses_every_sample_once_and_is_seeded() -> None:
    y = _labels(10, 60)
    coarse = [int(g) for g in GROUP_OF]
    a, b, c = (L.pachinko_partition(y, 12, coarse, np.random.default_rng(s)) for s in (4, 4, 5))
    assert all(len(p) == 50 for p in a) and len(np.unique(np.concatenate(a))) == 600
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert any(not np.array_equal(p, q) for p, q in zip(a, c, strict=True))


def test_pachinko_bad_inputs() -> None:
    y, coarse = _labels(10, 5), [int(g) for g in GROUP_OF]
    with pytest.raises(ConfigError, match="fewer clients"):
        L.pachinko_partition(y, 51, coarse, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="> 0"):
        L.pachinko_partition(y, 5, coarse, np.random.default_rng(0), alpha=0.0)
    with pytest.raises(ConfigError, match="one coarse-group id per class"):
        L.pachinko_partition(y, 5, coarse[:8], np.random.default_rng(0))
    with pytest.raises(ConfigError, match="needs a label hierarchy.*data.coarse_labels"):
        L.resolve_coarse_labels(None, "fashion_mnist")
    with pytest.raises(ConfigError, match="cifar100"):
        L.resolve_coarse_labels("cifar10O", "fashion_mnist")
    table = L.resolve_coarse_labels(None, "cifar100")
    assert len(table) == 100 and np.bincount(table).tolist() == [5] * 20


# ---- config and wiring (offline_digits: 1,797 samples, 10 classes) ----

@pytest.mark.parametrize("bad", [{"alpha": 0.0}, {"pachinko_alpha": -1.0}, {"pachinko_beta": 0.0},
                                 {"pathological_low": 0.7}, {"coarse_labels": [0, -1]}])
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="data\\."):
        DataConfig(**bad).validate()  # type: ignore[arg-type]


def test_build_federated_data_with_the_new_partitions() -> None:
    cfg = DataConfig(partition="pathological_uniform", num_clients=10, classes_per_client=2)
    fed = build_federated_data(cfg, seed=0)
    assert all(len(np.unique(c.train.labels)) == 2 for c in fed.clients)  # type: ignore[attr-defined]
    coarse = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    fed = build_federated_data(DataConfig(partition="pachinko", num_clients=8, coarse_labels=coarse), seed=0)
    sizes = {c.num_train for c in fed.clients}
    assert len(fed.clients) == 8 and len(sizes) == 1 and sizes.pop() > 100
    with pytest.raises(ConfigError, match="needs a label hierarchy"):
        build_federated_data(DataConfig(partition="pachinko", num_clients=8), seed=0)
