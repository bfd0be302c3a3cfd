"""Office-Caltech10 SURF: per-sample L1 + per-domain z-score (data.feature_norm: l1_zscore) beside log + L2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.config import DataConfig
from fedhet.data import build_federated_data
from fedhet.data.transforms import L1ZScore, feature_transforms
from fedhet.errors import ConfigError


def _counts(n: int, d: int, seed: int, scale: float) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).poisson(scale, (n, d)).astype(np.float32))


def _stack(ds: object) -> torch.Tensor:
    return torch.stack([ds[i][0] for i in range(len(ds))])  # type: ignore[index,arg-type]


def test_l1_zscore_by_hand() -> None:
    x = torch.tensor([[1.0, 3.0, 0.0], [2.0, 2.0, 4.0], [0.0, 5.0, 5.0]])
    u = x / x.sum(1, keepdim=True)  # per-sample L1
    mean, std = u.mean(0), u.std(0)  # sample std, as MATLAB's zscore
    train, eval_t = feature_transforms("l1_zscore", x)
    assert torch.allclose(train(x[1]), (u[1] - mean) / std) and torch.allclose(eval_t(x[1]), train(x[1]))
    assert torch.allclose(eval_t(3 * x[2]), eval_t(x[2]))  # the L1 step removes the sample's total count
    new = torch.tensor([7.0, 1.0, 2.0])  # not used for fitting: transformed with the training statistics
    assert torch.allclose(eval_t(new), (new / 10 - mean) / std)


def test_l1_zscore_constant_feature_and_zero_sample() -> None:
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 0.0]])  # feature 1 never occurs: std 1, not a division by 0
    t = L1ZScore.fit(x)
    assert torch.isfinite(t(torch.tensor([0.0, 5.0]))).all() and torch.isfinite(t(torch.zeros(2))).all()


def test_surf_build_fits_each_client_on_its_own_training_split(tmp_path: Path) -> None:
    (tmp_path / "office_caltech10_surf").mkdir()
    for i, (dom, scale) in enumerate((("dslr", 0.5), ("webcam", 4.0))):
        x = _counts(100, 800, i, scale)
        np.savez(tmp_path / "office_caltech10_surf" / f"{dom}.npz", x=x.numpy().astype(np.uint8),
                 y=np.arange(100) % 10)
    cfg = DataConfig(dataset="office_caltech10_surf", root=str(tmp_path), domains=["dslr", "webcam"],
                     feature_norm="l1_zscore", test_fraction=0.3)
    fed = build_federated_data(cfg, seed=0)
    for c in fed.clients:
        tr = _stack(c.train_eval)
        assert tr.shape == (70, 800)
        moving = tr.std(0) > 0
        assert tr.mean(0).abs().max() < 1e-4 and torch.allclose(tr.std(0)[moving], torch.ones(int(moving.sum())),
                                                                  atol=1e-4)
        assert _stack(c.test).mean(0).abs().max() > 1e-3  # the test split is not refitted
    default = build_federated_data(DataConfig(dataset="office_caltech10_surf", root=str(tmp_path),
                                              domains=["dslr"]), seed=0)
    x, _ = default.clients[0].train[0]
    assert torch.isclose(x.norm(), torch.tensor(800.0).sqrt())  # today's log + L2 stays the default


@pytest.mark.parametrize(("dataset", "norm", "needle"), [
    ("office_caltech10_surf", "l1_zscor", "did you mean 'l1_zscore'"),
    ("offline_digits", "l1_zscore", "feature-vector datasets only")])
def test_bad_feature_norm(dataset: str, norm: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_federated_data(DataConfig(dataset=dataset, feature_norm=norm), seed=0)


def test_real_surf_l1_zscore(data_root: Path) -> None:
    if not (data_root / "office_caltech10_surf" / "dslr.npz").is_file():
        pytest.skip("SURF data absent")
    fed = build_federated_data(DataConfig(dataset="office_caltech10_surf", root=str(data_root),
                                          domains=["dslr", "webcam"], feature_norm="l1_zscore"), seed=0)
    tr = _stack(fed.clients[0].train_eval)
    assert tr.shape[1] == 800 and tr.mean(0).abs().max() < 1e-4
