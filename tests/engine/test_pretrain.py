"""`fedhet pretrain`: a backbone trained centrally once, found again for the same config, loaded by later runs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("easy_vqa")

from fedhet.cli import main  # noqa: E402
from fedhet.config import load_config  # noqa: E402
from fedhet.launch.pretrain import pretrain_backbone  # noqa: E402
from fedhet.models import build_model  # noqa: E402

SMALL = ["data.dataset=easy_vqa_source", "data.max_train_per_client=256", "model.name=vl_transformer",
         "model.args={d: 16, depth: 1, heads: 2}", "train.optimizer=adamw", "train.batch_size=64", "run.num_threads=1"]


def test_pretraining_is_cached_by_config_and_loads_into_a_run(tmp_path, capsys) -> None:
    out = tmp_path / "backbone.pt"
    first = pretrain_backbone(load_config(None, [*SMALL, "train.lr=0.003"]), out)
    again = pretrain_backbone(load_config(None, [*SMALL, "train.lr=0.003"]), out)
    assert first.trained and not again.trained and again.accuracy == first.accuracy
    other = pretrain_backbone(load_config(None, [*SMALL, "train.lr=0.001"]), out)
    assert other.trained  # another config is another pretraining
    assert main(["pretrain", *SMALL, "train.lr=0.001", "--out", str(out)]) == 0
    assert "found" in capsys.readouterr().out
    saved = torch.load(out, weights_only=True)["state"]
    model = build_model("vl_transformer", 13, (3, 32, 32), d=16, depth=1, heads=2, checkpoint=str(out))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert main(["pretrain", *SMALL, "--out", str(out), "--epochs", "0"]) == 2  # one clear error


def test_pretraining_shows_a_progress_bar(capsys) -> None:
    import torch
    from torch import nn

    from fedhet.models.vl_pretrain import pretrain

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
            return self.fc(x[0])

    batches = [([torch.randn(3, 4), torch.zeros(3)], torch.tensor([0, 1, 0]))] * 5
    result = pretrain(Tiny(), batches, epochs=2, progress=True)
    err = capsys.readouterr().err
    assert result.steps == 10 and "pretrain" in err and "10/10" in err
