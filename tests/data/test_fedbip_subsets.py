"""FedBiP's class subsets (`domainnet_fedbip`, `officehome_fedbip`; fedhet.data.fedbip_subsets) on tiny fabricated
image folders: the right classes in the official code's order, other class folders ignored, the Office-Home
"Real World" alias, federated building, and the hub download (faked) writing only the subset into its own folder."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedhet.config import DataConfig
from fedhet.data import build_federated_data
from fedhet.data.registry import LoadContext, get_spec


def _write(folder: Path, n: int, value: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(np.full((9, 12, 3), value + i, np.uint8)).save(folder / f"{i}.png")


def test_domainnet_fedbip_has_the_papers_10_classes_and_reads_a_full_copy(tmp_path: Path) -> None:
    spec = get_spec("domainnet_fedbip")
    assert spec.classes == ("airplane", "axe", "basketball", "bicycle", "bird", "bracelet", "clock", "flower",
                            "pizza", "strawberry")
    for dom in ("clipart", "sketch"):
        for cls in ("airplane", "zebra", "strawberry"):  # zebra: a DomainNet class outside the subset
            _write(tmp_path / "DomainNet" / dom / cls, 4)
    d = spec.loader(LoadContext(tmp_path, 16), "clipart")
    assert d.x_train.shape == (8, 3, 16, 16) and sorted(set(d.y_train.tolist())) == [0, 9]
    fed = build_federated_data(DataConfig(dataset="domainnet_fedbip", root=str(tmp_path),
                                          domains=["clipart", "sketch"], image_size=16), seed=0)
    assert [c.name for c in fed.clients] == ["clipart", "sketch"] and fed.input_shape == (3, 16, 16)


def test_officehome_fedbip_has_the_official_20_classes_and_the_real_world_alias(tmp_path: Path) -> None:
    spec = get_spec("officehome_fedbip")
    assert len(spec.classes) == 20 and spec.classes[0] == "Bucket" and spec.classes[-1] == "Toys"
    assert "Alarm_Clock" not in spec.classes and list(spec.classes) == sorted(spec.classes)
    for cls in ("Couch", "Webcam", "Toys"):  # Webcam: outside the subset
        _write(tmp_path / "OfficeHome" / "Real World" / cls, 2)
    d = spec.loader(LoadContext(tmp_path, 8), "Real_World")
    assert sorted(d.y_train.tolist()) == [spec.classes.index("Couch")] * 2 + [19, 19]


class _Labels:
    def __init__(self, names: list[str]) -> None:
        self.names = names


class _Split:
    """Just enough of a `datasets` split for fedhet.data.download."""

    def __init__(self, rows: list[dict], names: list[str]) -> None:
        self.rows, self.features = rows, {"image": object(), "domain": object(), "label": _Labels(names)}
        self.column_names = list(self.features)

    def __getitem__(self, key: str) -> list:
        return [r[key] for r in self.rows]

    def select(self, idx: list[int]) -> _Split:
        return _Split([self.rows[i] for i in idx], self.features["label"].names)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.rows)


def test_download_writes_only_the_subset_into_its_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["airplane", "zebra", "pizza"]
    rows = [{"image": Image.fromarray(np.full((8, 8, 3), 10 * i, np.uint8)), "domain": dom, "label": lab}
            for i, (dom, lab) in enumerate([("clipart", 0), ("clipart", 1), ("clipart", 2), ("real", 2)])]
    calls: list[str] = []

    def load_dataset(repo: str, **_: object) -> dict:
        calls.append(repo)
        return {"train": _Split(rows, names)}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    spec = get_spec("domainnet_fedbip")
    d = spec.loader(LoadContext(tmp_path, 8, download=True), "clipart")
    assert calls == ["flwrlabs/domainnet"] and sorted(d.y_train.tolist()) == [0, spec.classes.index("pizza")]
    base = tmp_path / "DomainNet_FedBiP"
    assert sorted(p.name for p in (base / "clipart").iterdir()) == ["airplane", "pizza"]  # zebra not written
    assert not (tmp_path / "DomainNet").exists()
