"""`model.init_from`: any model's features start from a `fedhet pretrain` file (transfer), the head fresh; a stem
pretrained on RGB images serves grey clients with its kernels summed over the colour channels."""

from __future__ import annotations

import pytest
import torch

from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.errors import CheckpointError
from fedhet.launch.pretrain import pretrain_backbone
from fedhet.models import build_model
from fedhet.models.vl_pretrain import adapt_input_channels, load_backbone, save_backbone

SOURCE = ["data.dataset=offline_digits", "data.domains=[clean]", "data.fraction=0.2", "model.name=small_cnn",
          "model.args={width: 4, embed_dim: 8}", "train.optimizer=adamw", "train.batch_size=32", "run.num_threads=1"]


def test_rgb_pretraining_starts_a_run_with_fresh_head(tmp_path) -> None:
    out = tmp_path / "cnn.pt"
    pretrain_backbone(load_config(None, SOURCE), out)
    saved = torch.load(out, weights_only=True)["state"]
    cfg = load_config(None, [*SOURCE[1:], "data.dataset=offline_digits", f"model.init_from={out}"])
    model = build_experiment(cfg).model_fn()
    fresh = build_experiment(load_config(None, [*SOURCE[1:], "data.dataset=offline_digits"])).model_fn()
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in saved.items() if not k.startswith("head."))
    assert all(torch.equal(own[k], fresh.state_dict()[k]) for k in own if k.startswith("head."))
    with pytest.raises(CheckpointError, match="does not fit this model"):
        build_experiment(load_config(None, [*SOURCE[1:], "model.args={width: 8, embed_dim: 8}",
                                            f"model.init_from={out}"])).model_fn()


def test_input_channels_are_adapted_like_timm() -> None:
    rgb = torch.randn(4, 3, 3, 3)
    assert torch.equal(adapt_input_channels(rgb, torch.zeros(4, 1, 3, 3)), rgb.sum(1, keepdim=True))
    grey = torch.randn(4, 1, 3, 3)
    assert torch.allclose(adapt_input_channels(grey, torch.zeros(4, 3, 3, 3)), grey.repeat(1, 3, 1, 1) / 3)
    assert adapt_input_channels(rgb, torch.zeros(5, 1, 3, 3)) is rgb  # other out-channels: left to the check
    x = torch.randn(2, 1, 8, 8)  # a grey image through the summed kernel = its RGB copy through the RGB kernel
    assert torch.allclose(torch.nn.functional.conv2d(x, adapt_input_channels(rgb, grey)),
                          torch.nn.functional.conv2d(x.repeat(1, 3, 1, 1), rgb), atol=1e-5)


def test_a_grey_model_loads_an_rgb_backbone(tmp_path) -> None:
    rgb = build_model("small_cnn", 10, (3, 28, 28), width=4, embed_dim=8)
    save_backbone(rgb, tmp_path / "rgb.pt")
    grey = build_model("small_cnn", 10, (1, 28, 28), width=4, embed_dim=8)
    load_backbone(grey, tmp_path / "rgb.pt", head=False)
    stem = next(k for k, v in rgb.state_dict().items() if v.ndim == 4)
    assert torch.equal(grey.state_dict()[stem], rgb.state_dict()[stem].sum(1, keepdim=True))


def test_a_missing_init_from_file_is_one_clear_error_before_anything_runs(tmp_path, capsys) -> None:
    from fedhet.cli import main

    assert main(["run", *SOURCE, f"model.init_from={tmp_path / 'none.pt'}", "rounds=1", f"run.out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "no such file; pretrain it first" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_plain_state_dict_is_accepted(tmp_path) -> None:
    source = build_model("small_cnn", 10, (3, 8, 8), width=4, embed_dim=8)
    path = tmp_path / "plain.pt"
    torch.save(source.state_dict(), path)
    target = build_model("small_cnn", 10, (3, 8, 8), width=4, embed_dim=8)
    assert load_backbone(target, path, head=False) == {}
    assert all(torch.equal(target.state_dict()[k], v) for k, v in source.state_dict().items()
               if not k.startswith("head."))


class _Crafted:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("ran",))


def test_a_crafted_file_is_refused_without_torchs_advice(tmp_path, capsys) -> None:
    from fedhet.cli import main

    path = tmp_path / "crafted.pt"
    torch.save({"state": _Crafted()}, path)
    assert main(["run", "--quiet", *SOURCE, f"model.init_from={path}", "rounds=1",
                 "--run-dir", str(tmp_path / "r")]) == 2
    captured = capsys.readouterr()
    assert "was not loaded" in captured.err and "weights_only" not in captured.err
    assert "ran" not in captured.out

