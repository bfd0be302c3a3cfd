"""Fed-Heart-Disease as FLamby prepares it (the default) and fedhet's earlier 13-column form (`uci13`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.config import DataConfig
from fedhet.data import build_federated_data
from fedhet.data.heart_disease import FLAMBY_FEATURES, flamby_domain, load_heart_domain
from fedhet.data.registry import LoadContext
from fedhet.errors import ConfigError, FedhetError

HOSPITALS = ("cleveland", "hungarian", "switzerland", "va")
FLAMBY_COUNTS = [(199, 104), (172, 89), (30, 16), (85, 45)]  # FLamby's README, train / test per hospital


def _row(age: int, cp: str, restecg: str, chol: str = "200", ca: str = "0", num: int = 0) -> str:
    # age sex cp trestbps chol fbs restecg thalach exang oldpeak slope ca thal num
    return f"{age},1,{cp},130,{chol},0,{restecg},150,0,1.5,?,{ca},?,{num}"


def _write(root: Path, lines: list[str], hospital: str = "cleveland") -> None:
    (root / "uci_heart_disease").mkdir(exist_ok=True)
    (root / "uci_heart_disease" / f"processed.{hospital}.data").write_text("\n".join(lines) + "\n")


def _test_rows(fed: object) -> list[set[tuple[float, ...]]]:
    return [{tuple(c.test.parts[0].x[int(i)].tolist()) for i in c.test.parts[0].index}  # type: ignore[attr-defined]
            for c in fed.clients]  # type: ignore[attr-defined]


def test_real_counts_per_hospital_fixed_for_every_seed(data_root: Path) -> None:
    if not (data_root / "uci_heart_disease" / "processed.va.data").is_file():
        pytest.skip("heart disease data absent")
    cfgs = [DataConfig(dataset="heart_disease", root=str(data_root), test_fraction=f) for f in (0.2, 0.5)]
    fed = build_federated_data(cfgs[0], seed=0)
    assert [c.name for c in fed.clients] == list(HOSPITALS) and fed.input_shape == (13,)
    assert [(c.num_train, len(c.test)) for c in fed.clients] == FLAMBY_COUNTS  # 740 rows in all
    for c in fed.clients:
        assert not torch.isnan(c.train.parts[0].x).any()
    other = build_federated_data(cfgs[1], seed=1)  # another seed and test_fraction: the same split
    assert _test_rows(other) == _test_rows(fed)


def test_real_uci13_switch_keeps_every_row(data_root: Path) -> None:
    if not (data_root / "uci_heart_disease" / "processed.va.data").is_file():
        pytest.skip("heart disease data absent")
    cfg = DataConfig(dataset="heart_disease", root=str(data_root), heart_preprocessing="uci13", test_fraction=0.3)
    fed, fed1 = build_federated_data(cfg, seed=0), build_federated_data(cfg, seed=1)
    assert sum(c.num_train + len(c.test) for c in fed.clients) == 920
    assert [len(c.test) for c in fed.clients] == [91, 88, 37, 60]  # round(0.3 n)
    assert bool(torch.isnan(fed.clients[2].train.parts[0].x).any())  # gaps kept, imputed by the normaliser
    assert _test_rows(fed) != _test_rows(fed1)  # re-split per seed


def test_fabricated_rows_columns_and_split(tmp_path: Path) -> None:
    rows = [_row(40 + i, cp=str(1 + i % 4), restecg=str(i % 3), num=int(i % 2 == 0) * (1 + i % 3)) for i in range(20)]
    rows[3] = _row(43, "4", "0", chol="?")  # missing in a kept column: the row is dropped
    rows[5] = _row(45, "2", "2", ca="?", num=1)  # missing only in a dropped column (ca): kept
    _write(tmp_path, rows)
    d = flamby_domain(load_heart_domain(LoadContext(tmp_path, 0), "cleveland"), "cleveland")
    assert d.x_test is not None and d.y_test is not None
    assert (len(d.y_train), len(d.y_test)) == (12, 7)  # 19 complete rows: floor(0.66 n) / ceil(0.34 n)
    x = torch.cat([d.x_train, d.x_test])
    assert x.shape[1] == len(FLAMBY_FEATURES) == 13
    by_age = {int(r[0]): r.tolist() for r in x}
    assert 43 not in by_age and 45 in by_age
    # age sex trestbps chol fbs thalach exang oldpeak | cp_2 cp_3 cp_4 | restecg_1 restecg_2
    assert by_age[45] == [45, 1, 130, 200, 0, 150, 0, 1.5, 1, 0, 0, 0, 1]
    assert by_age[40][8:] == [0, 0, 0, 0, 0]  # cp 1, restecg 0: the dropped first levels
    assert sorted(np.bincount(d.y_test.numpy()).tolist()) == [3, 4]  # stratified: 11 positives, 8 negatives -> 4 / 3


def test_fabricated_unknown_level_is_one_clear_error(tmp_path: Path) -> None:
    _write(tmp_path, [_row(50 + i, cp="5" if i == 0 else "1", restecg="0", num=i % 2) for i in range(8)])
    with pytest.raises(FedhetError, match="column 'cp' holds \\[5.0\\]") as e:
        flamby_domain(load_heart_domain(LoadContext(tmp_path, 0), "cleveland"), "cleveland")
    assert "\n" not in str(e.value)


def test_fabricated_build_uses_flamby_by_default(tmp_path: Path) -> None:
    for h in HOSPITALS:
        _write(tmp_path, [_row(30 + i, cp=str(1 + i % 4), restecg=str(i % 3), num=i % 2) for i in range(10)], h)
    fed = build_federated_data(DataConfig(dataset="heart_disease", root=str(tmp_path)), seed=0)
    assert [(c.num_train, len(c.test)) for c in fed.clients] == [(6, 4)] * 4
    old = build_federated_data(DataConfig(dataset="heart_disease", root=str(tmp_path),
                                          heart_preprocessing="uci13", test_fraction=0.2), seed=0)
    assert [(c.num_train, len(c.test)) for c in old.clients] == [(8, 2)] * 4


@pytest.mark.parametrize(("dataset", "value", "needle"), [
    ("heart_disease", "flamb", "must be one of flamby, uci13"),
    ("offline_digits", "uci13", "applies to dataset 'heart_disease' only")])
def test_bad_heart_preprocessing(dataset: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_federated_data(DataConfig(dataset=dataset, heart_preprocessing=value), seed=0)
