"""build_federated_data on the built-in offline_digits benchmark (and the real feature datasets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.config import DataConfig
from fedhet.data import FederatedData, IndexedDataset, build_federated_data, plot_partition


def _keys(ds: IndexedDataset) -> set[tuple[str, int]]:
    """(domain, row) of every sample; offline_digits splits all index the same per-domain tensor."""
    return {(p.domain, int(i)) for p in ds.parts for i in p.index}


def _check_disjoint(fed: FederatedData) -> None:
    seen: set[tuple[str, int]] = set()
    for c in fed.clients:
        for ds in (c.train, c.val, c.test):
            if ds is None:
                continue
            k = _keys(ds)  # type: ignore[arg-type]
            assert not (k & seen), f"{c.name} shares samples"
            seen |= k


def test_default_domain_partition() -> None:
    fed = build_federated_data(DataConfig(), seed=0)
    assert fed.dataset == "offline_digits" and fed.num_classes == 10 and fed.input_shape == (3, 28, 28)
    assert [c.name for c in fed.clients] == ["clean", "inverted", "colored", "thick_blur"]
    _check_disjoint(fed)
    assert sum(c.num_train + len(c.test) for c in fed.clients) == 1797
    x, y = fed.clients[0].train[0]
    assert x.shape == (3, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64 and y.ndim == 0
    assert len(fed.pooled_test()) == sum(len(c.test) for c in fed.clients)
    assert len(fed.pooled_train()) == sum(c.num_train for c in fed.clients)
    ev = fed.clients[1].train_eval
    assert len(ev) == fed.clients[1].num_train and torch.equal(ev[0][0], ev[0][0])


def test_same_seed_same_split_other_seed_differs() -> None:
    cfg = DataConfig(partition="dirichlet", num_clients=5, alpha=0.5, fraction=0.5, val_fraction=0.1)
    a, b, c = (build_federated_data(cfg, seed=s) for s in (3, 3, 4))
    for x, y in zip(a.clients, b.clients, strict=True):
        assert _keys(x.train) == _keys(y.train) and _keys(x.test) == _keys(y.test)  # type: ignore[arg-type]
        assert _keys(x.val) == _keys(y.val)  # type: ignore[arg-type]
    assert any(_keys(x.train) != _keys(y.train) for x, y in zip(a.clients, c.clients, strict=True))  # type: ignore
    _check_disjoint(a)
    assert all(cl.domain == "mixed" for cl in a.clients)


@pytest.mark.parametrize("partition", ["dirichlet", "pathological", "quantity", "iid"])
def test_label_partitions_test_follows_client_labels(partition: str) -> None:
    cfg = DataConfig(partition=partition, num_clients=4, classes_per_client=2, alpha=0.3)
    fed = build_federated_data(cfg, seed=0)
    assert [c.name for c in fed.clients] == ["client0", "client1", "client2", "client3"]
    _check_disjoint(fed)
    for c in fed.clients:
        train_classes = set(np.unique(c.train.labels))  # type: ignore[attr-defined]
        assert set(np.unique(c.test.labels)) <= train_classes  # type: ignore[attr-defined]
        if partition == "pathological":
            assert len(train_classes) == 2


def test_clients_per_domain_fraction_caps() -> None:
    cfg = DataConfig(domains=["colored", "clean"], clients_per_domain=3, fraction=0.1, min_train_per_client=15,
                     max_test_per_client=10)
    fed = build_federated_data(cfg, seed=1)
    assert [c.name for c in fed.clients] == [f"{d}#{k}" for d in ("colored", "clean") for k in range(3)]
    _check_disjoint(fed)
    for c in fed.clients:
        assert c.num_train == 15 and len(c.test) == 10 and c.domain in ("colored", "clean")
        assert len(np.unique(c.train.labels)) == 10  # type: ignore[attr-defined]


def test_describe_and_plot(tmp_path: Path) -> None:
    fed = build_federated_data(DataConfig(partition="dirichlet", num_clients=3, val_fraction=0.2), seed=0)
    text = fed.describe()
    assert "client0" in text and "#train" in text and "total" in text and "dirichlet" in text
    out = plot_partition(fed, tmp_path / "p.png")
    assert out.stat().st_size > 1000


def test_input_noise_and_no_augment() -> None:
    fed = build_federated_data(DataConfig(augment=False, input_noise_std=0.2), seed=0)
    c = fed.clients[0]
    x, _ = c.train[0]
    e, _ = c.train_eval[0]
    assert 0.1 < (x - e).std().item() < 0.3


def test_heart_disease_standardised_per_client(data_root: Path) -> None:
    if not (data_root / "uci_heart_disease").is_dir():
        pytest.skip("heart disease data absent")
    fed = build_federated_data(DataConfig(dataset="heart_disease", root=str(data_root)), seed=0)
    assert fed.input_shape == (13,) and fed.num_classes == 2 and len(fed.clients) == 4
    for c in fed.clients:
        x = torch.stack([c.train_eval[i][0] for i in range(len(c.train_eval))])
        assert not torch.isnan(x).any()
        assert x.mean(0).abs().max() < 1e-4
        test_x = torch.stack([c.test[i][0] for i in range(len(c.test))])
        assert not torch.isnan(test_x).any()


def test_surf_build(data_root: Path) -> None:
    if not (data_root / "office_caltech10_surf").is_dir():
        pytest.skip("SURF data absent")
    fed = build_federated_data(DataConfig(dataset="office_caltech10_surf", root=str(data_root),
                                          domains=["dslr", "webcam"], val_fraction=0.1), seed=0)
    assert fed.input_shape == (800,)
    x, y = fed.clients[0].train[0]
    assert x.shape == (800,) and torch.isclose(x.norm(), torch.tensor(800.0).sqrt())


def test_max_train_per_client_caps_stratified() -> None:
    from fedhet.config import DataConfig
    from fedhet.data import build_federated_data

    fed = build_federated_data(DataConfig(dataset="offline_digits", max_train_per_client=50), seed=0)
    for client in fed.clients:
        assert client.num_train == 50
        labels = [int(client.train_eval[i][1]) for i in range(50)]
        assert len(set(labels)) == 10  # stratified: every class kept
