"""RxRx1 loader on a tiny fabricated directory in the WILDS layout (no real RxRx1 data is used)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedhet.config import DataConfig
from fedhet.data import build_federated_data, dataset_info, rxrx1
from fedhet.data.registry import LoadContext
from fedhet.errors import DatasetNotFoundError

CELLS = ("HEPG2", "HUVEC", "RPE", "U2OS")
HEADER = ("site_id", "well_id", "cell_type", "dataset", "experiment", "plate", "well", "site", "well_type",
          "sirna", "sirna_id")


def _rows() -> list[dict[str, object]]:
    """Training rows: siRNAs 0..44 three times, 45..59 twice (a tie across the top-50 cut), spread over cell
    types; held-out rows (val / test) of a few siRNAs, and siRNA 100, the most frequent overall but absent
    from training (so it must not be selected)."""
    rows: list[dict[str, object]] = []

    def add(cell: str, split: str, exp: int, plate: int, well: str, site: int, sirna: int) -> None:
        well_id = f"{cell}-{exp:02d}_{plate}_{well}"
        rows.append({"site_id": f"{well_id}_{site}", "well_id": well_id, "cell_type": cell, "dataset": split,
                     "experiment": f"{cell}-{exp:02d}", "plate": plate, "well": well, "site": site,
                     "well_type": "treatment", "sirna": f"s{sirna}", "sirna_id": sirna})

    for s in range(60):
        for j in range(3 if s < 45 else 2):
            add(CELLS[(s + j) % 4], "train", 1, 1 + j, f"B{s:02d}", 1 + j % 2, s)
    for k, cell in enumerate(CELLS):
        add(cell, "test", 2, 1, "C02", 1, 0)
        add(cell, "val", 3, 2, "C03", 2, 49)
        add(cell, "test", 2, 1, "C04", 1, 50)  # not in the top 50: dropped
        for i in range(4):
            add(cell, "test", 2, 3, f"D{k}{i}", 1, 100)
    return rows


def fabricate(root: Path, size: int = 10) -> Path:
    """<root>/rxrx1_v1.0/{metadata.csv, images/<experiment>/Plate<p>/<well>_s<site>.png}; pixel value = sirna_id."""
    base = root / "rxrx1_v1.0"
    rows = _rows()
    for r in rows:
        folder = base / "images" / str(r["experiment"]) / f"Plate{r['plate']}"
        folder.mkdir(parents=True, exist_ok=True)
        v = int(r["sirna_id"]) % 256
        img = np.full((size, size, 3), (v, 255 - v, 7), np.uint8)
        Image.fromarray(img).save(folder / f"{r['well']}_s{r['site']}.png")
    with (base / "metadata.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return base


def test_registered_cell_type_domains() -> None:
    info = dataset_info("rxrx1")
    assert info.domains == CELLS and len(info.classes) == 50 and info.modality == "image"
    assert "wilds" in info.source.lower() and "rxrx1_v1.0/metadata.csv" in info.layout


def test_top50_from_training_rows_with_tie_break(tmp_path: Path) -> None:
    base = fabricate(tmp_path)
    top = rxrx1.top_sirnas(rxrx1.read_metadata(base / "metadata.csv"))
    assert top == list(range(50))  # 0..44 (3 each), then the smallest five of the 2-count tie: 45..49; not 100
    rows = [{"dataset": "train", "sirna_id": str(s)} for s in (5, 5, 3, 3, 9, 1)]
    assert rxrx1.top_sirnas(rows, k=2) == [3, 5]
    with pytest.raises(DatasetNotFoundError, match="only 4 siRNAs"):
        rxrx1.top_sirnas(rows, k=5)


def test_domain_split_labels_and_images(tmp_path: Path) -> None:
    fabricate(tmp_path)
    d = rxrx1.load_rxrx1_domain(LoadContext(tmp_path, 12), "HUVEC")
    expected = sorted(s for s in range(50) for j in range(3 if s < 45 else 2) if CELLS[(s + j) % 4] == "HUVEC")
    assert d.x_train.shape == (len(expected), 3, 12, 12) and d.x_train.dtype == torch.uint8
    assert sorted(d.y_train.tolist()) == expected  # labels = rank among the selected ids = the id here
    assert torch.equal(d.x_train[:, 0, 0, 0].long(), d.y_train)  # each image is its own row's file
    assert d.x_test is not None and d.y_test is not None
    assert sorted(d.y_test.tolist()) == [0, 49]  # test + val rows of the top 50; siRNA 50 and 100 dropped
    assert "sirna_id 0, 1, 2" in d.note


def test_labels_follow_sorted_selected_ids(tmp_path: Path) -> None:
    base = fabricate(tmp_path)
    meta = base / "metadata.csv"
    meta.write_text(meta.read_text().replace(",s3,3\n", ",s3,503\n"))  # siRNA 3 becomes id 503 (3 rows)
    top = rxrx1.top_sirnas(rxrx1.read_metadata(meta))
    assert top == [0, 1, 2, *range(4, 50), 503]
    d = rxrx1.load_rxrx1_domain(LoadContext(tmp_path, 8), "U2OS")  # siRNA 3's rows: U2OS, HEPG2, HUVEC
    assert 49 in d.y_train.tolist() and "503" in d.note


def test_federated_build_four_clients(tmp_path: Path) -> None:
    fabricate(tmp_path)
    fed = build_federated_data(DataConfig(dataset="rxrx1", root=str(tmp_path), image_size=16, augment=False), seed=0)
    assert [c.name for c in fed.clients] == list(CELLS) and fed.num_classes == 50
    assert all(len(c.test) == 2 for c in fed.clients)
    assert sum(len(c.train) for c in fed.clients) == 45 * 3 + 5 * 2
    x, _ = fed.clients[3].train[0]
    assert x.shape == (3, 16, 16)


def test_missing_data_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as e:
        rxrx1.load_rxrx1_domain(LoadContext(tmp_path, 16), "RPE")
    msg = str(e.value)
    assert "rxrx1_v1.0/metadata.csv" in msg and "get_dataset('rxrx1'" in msg
    assert "rxrx1_v1.0/images/<experiment>/Plate<plate>/<well>_s<site>.png" in msg
    base = fabricate(tmp_path)
    (base / "images" / "HEPG2-01" / "Plate1" / "B00_s1.png").unlink()  # siRNA 0's first training row
    with pytest.raises(DatasetNotFoundError, match="1 of the .* images listed in metadata.csv are missing"):
        rxrx1.load_rxrx1_domain(LoadContext(tmp_path, 16), "HEPG2")


def test_bad_metadata_columns(tmp_path: Path) -> None:
    base = tmp_path / "rxrx1_v1.0"
    base.mkdir()
    (base / "metadata.csv").write_text("site_id,cell_type\nx,RPE\n")
    with pytest.raises(DatasetNotFoundError, match="missing columns dataset"):
        rxrx1.load_rxrx1_domain(LoadContext(tmp_path, 16), "RPE")
