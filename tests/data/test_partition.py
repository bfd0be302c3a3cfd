from __future__ import annotations

import numpy as np
import pytest

from fedhet.data import partition as P
from fedhet.errors import ConfigError


def _labels(n: int = 1000, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def _check_disjoint_cover(parts: list[np.ndarray], n: int, full: bool = True) -> None:
    cat = np.concatenate(parts)
    assert len(np.unique(cat)) == len(cat), "clients share samples"
    if full:
        assert sorted(cat.tolist()) == list(range(n))


def test_allocate_sums_and_caps() -> None:
    out = P.allocate(np.array([1.0, 1.0, 1.0]), 10)
    assert out.sum() == 10 and out.max() - out.min() <= 1
    capped = P.allocate(np.array([10.0, 1.0]), 6, caps=np.array([2, 10]))
    assert capped.tolist() == [2, 4]


def test_iid_partition() -> None:
    parts = P.iid_partition(103, 4, np.random.default_rng(0))
    _check_disjoint_cover(parts, 103)
    assert {len(p) for p in parts} <= {25, 26}
    again = P.iid_partition(103, 4, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    with pytest.raises(ConfigError):
        P.iid_partition(3, 4, np.random.default_rng(0))


def test_domain_partition_keeps_domains_apart() -> None:
    dom = np.repeat([0, 1, 2], [30, 20, 10])
    parts = P.domain_partition(dom, 2, np.random.default_rng(0))
    assert len(parts) == 6
    _check_disjoint_cover(parts, 60)
    for p in parts:
        assert len(np.unique(dom[p])) == 1
    assert [len(p) for p in parts] == [15, 15, 10, 10, 5, 5]


def test_dirichlet_sizes_min_and_determinism() -> None:
    y = _labels()
    parts = P.dirichlet_partition(y, 8, 0.3, np.random.default_rng(1), min_size=10)
    _check_disjoint_cover(parts, len(y))
    assert min(len(p) for p in parts) >= 10
    again = P.dirichlet_partition(y, 8, 0.3, np.random.default_rng(1), min_size=10)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = P.dirichlet_partition(y, 8, 0.3, np.random.default_rng(2), min_size=10)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def _skew(y: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean over clients of the largest class share."""
    return float(np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts]))


def test_dirichlet_smaller_alpha_more_skew() -> None:
    y = _labels()
    low = np.mean([_skew(y, P.dirichlet_partition(y, 5, 0.1, np.random.default_rng(s))) for s in range(3)])
    high = np.mean([_skew(y, P.dirichlet_partition(y, 5, 100.0, np.random.default_rng(s))) for s in range(3)])
    assert low > high + 0.2


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_exact_classes(k: int) -> None:
    y = _labels()
    parts = P.pathological_partition(y, 10, k, np.random.default_rng(0))
    _check_disjoint_cover(parts, len(y))  # 10 clients * k >= 10 classes: every sample used
    for p in parts:
        assert len(np.unique(y[p])) == k


def test_pathological_drops_unowned_classes_and_rejects_large_k() -> None:
    y = _labels()
    parts = P.pathological_partition(y, 2, 2, np.random.default_rng(0))
    _check_disjoint_cover(parts, len(y), full=False)
    assert len(np.unique(y[np.concatenate(parts)])) == 4
    with pytest.raises(ConfigError):
        P.pathological_partition(y, 2, 11, np.random.default_rng(0))


def test_quantity_partition() -> None:
    parts = P.quantity_partition(1000, 6, 0.5, np.random.default_rng(0), min_size=10)
    _check_disjoint_cover(parts, 1000)
    sizes = [len(p) for p in parts]
    assert min(sizes) >= 10 and max(sizes) > 2 * min(sizes)


def test_stratified_split() -> None:
    y = np.repeat(np.arange(5), [100, 50, 20, 2, 1])
    kept, held = P.stratified_split(y, 0.2, np.random.default_rng(0))
    assert len(np.intersect1d(kept, held)) == 0 and len(kept) + len(held) == len(y)
    assert abs(len(held) - 0.2 * len(y)) <= 2
    assert np.bincount(y[held], minlength=5)[0] == 20
    assert set(np.unique(y[kept])) == set(range(5))  # no class loses its last sample


def test_fraction_subsample() -> None:
    y = np.repeat(np.arange(10), 50)
    keep = P.fraction_subsample(y, 0.1, 0, np.random.default_rng(0))
    assert len(keep) == 50 and np.bincount(y[keep]).tolist() == [5] * 10
    tiny = P.fraction_subsample(y, 0.01, 0, np.random.default_rng(0))
    assert len(tiny) == 5 and len(np.unique(y[tiny])) == 5
    floor = P.fraction_subsample(y, 0.01, 30, np.random.default_rng(0))
    assert len(floor) == 30 and len(np.unique(y[floor])) == 10  # at least one per class
    assert len(P.fraction_subsample(y, 1.0, 0, np.random.default_rng(0))) == 500


def test_subsample_skewed_keeps_every_class() -> None:
    y = np.repeat(np.arange(3), [200, 5, 1])
    keep = P.subsample(y, 10, np.random.default_rng(0))
    assert len(keep) == 10 and set(np.unique(y[keep])) == {0, 1, 2}


def test_match_label_distribution() -> None:
    test = np.repeat(np.arange(3), 30)
    clients = [np.array([0] * 10), np.array([0] * 10 + [1] * 20), np.array([2] * 5)]
    parts = P.match_label_distribution(test, clients, np.random.default_rng(0))
    _check_disjoint_cover(parts, 90)
    assert np.bincount(test[parts[0]], minlength=3).tolist() == [15, 0, 0]
    assert np.bincount(test[parts[1]], minlength=3).tolist() == [15, 30, 0]
    assert np.bincount(test[parts[2]], minlength=3).tolist() == [0, 0, 30]
