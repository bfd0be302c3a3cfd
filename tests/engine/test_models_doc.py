"""docs/models.md: both plug-in examples run as written, and a plug-in whose features do not match its
feature_dim is one clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from fedhet.cli import main
from fedhet.errors import ConfigError
from fedhet.models import MODELS, SplitModel, build_model, register_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
TINY = ["rounds=1", "train.local_steps=1", "data.max_test_per_client=10", "run.num_threads=1", "--quiet"]


@pytest.fixture(autouse=True)
def _unregister() -> object:
    """The plug-ins these tests register leave the registry as they found it (docs/config.md lists it)."""
    before = set(MODELS.names())
    yield
    for name in set(MODELS.names()) - before:
        MODELS._items.pop(name)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("index, args", [(0, "{width: 8}"), (1, "{arch: resnet10t}")])
def test_the_documented_plugins_run(index: int, args: str, tmp_path: Path, monkeypatch) -> None:
    if index == 1:
        pytest.importorskip("timm")
    source = _blocks("python")[index]
    name = re.search(r"# (\w+\.py)", source).group(1)  # type: ignore[union-attr]
    (tmp_path / name).write_text(source)
    model = re.search(r'@register_model\("(\w+)"\)', source).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    assert main(["run", str(config), f"imports=[./{name}]", f"model.name={model}", f"model.args={args}",
                 "--run-dir", str(tmp_path / "run"), *TINY]) == 0


def _wrong(num_classes: int, input_shape: tuple[int, ...], pretrained: bool) -> SplitModel:
    features = nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), 12))
    return SplitModel(features, nn.Linear(10, num_classes), feature_dim=10, num_classes=num_classes)


def test_a_feature_size_mismatch_is_one_clear_error() -> None:
    register_model("test_wrong_feature_dim")(_wrong)
    with pytest.raises(ConfigError, match=r"features return \(2, 12\).*feature_dim is 10"):
        build_model("test_wrong_feature_dim", 3, (1, 4, 4))
