"""`fedhet ldm pretrain | samples` (docs/fedbip.md "Pretraining the small LDM"): the losses go down, the checkpoint
loads and generates, the cache is reused, a resumed run equals an uninterrupted one bit for bit, bad input is one
clear error. Tiny networks on a tiny built-in pool (offline_digits), CPU, a few dozen steps."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from fedhet.cli import main
from fedhet.errors import CheckpointError, FedhetError
from fedhet.launch.ldm_pretrain import LDMPretrained, pretrain_ldm, work_dir
from fedhet.launch.ldm_trainer import LDMTrainer
from fedhet.models.ldm import encode_images, load_components
from fedhet.models.ldm.pretrain_config import SampleSettings, load_pretrain_config
from fedhet.models.ldm.samples import prompt_samples
from fedhet.models.ldm.tiny import tiny_unet

POOL = ("pool=[{dataset: offline_digits, domain: clean, word: clean, max_images: 64}, "
        "{dataset: offline_digits, domain: inverted, word: inverted, max_images: 64}]")
TINY = ["image_size=16", "vae.blocks=[8,16]", "vae.norm_groups=4", "vae.batch_size=16", "vae.lr=0.003",
        "vae.steps=20", "unet.blocks=[16,32]", "unet.norm_groups=8", "unet.heads=2", "unet.batch_size=16",
        "unet.lr=0.003", "unet.warmup=0", "unet.steps=20", POOL, "samples.per_prompt=1", "samples.steps=2",
        "save_every=5", "num_threads=1"]
WEIGHTS = ("vae/diffusion_pytorch_model.safetensors", "unet/diffusion_pytorch_model.safetensors")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LDMPretrained:
    """One tiny pretraining, uninterrupted (20 VAE + 20 UNet steps)."""
    out = tmp_path_factory.mktemp("ldm") / "tiny"
    return pretrain_ldm(load_pretrain_config(None, TINY), out, progress=False)


def _losses(path: Path) -> dict[str, list[float]]:
    with open(path / "loss.csv") as fh:
        rows = list(csv.DictReader(fh))
    return {s: [float(r["loss"]) for r in rows if r["stage"] == s] for s in ("vae", "unet")}


def test_losses_go_down_and_the_checkpoint_loads_and_generates(tiny: LDMPretrained) -> None:
    assert tiny.trained and tiny.finished and not work_dir(tiny.path).exists()
    assert tiny.meta["seconds"]["encode"] > 0  # the pool's encoding is timed (and counts against --minutes)
    for stage, values in _losses(tiny.path).items():
        assert len(values) == 20
        assert sum(values[-5:]) / 5 < sum(values[:5]) / 5, f"the {stage} loss did not go down: {values}"
    parts = load_components(tiny.path)
    assert parts.text_dim == 384 and parts.text_encoder.config.num_hidden_layers == 6  # the real MiniLM-L6
    assert parts.unet.config.cross_attention_dim == 384 and (parts.vae_factor, parts.unet_factor) == (2, 2)
    assert float(parts.vae.config.scaling_factor) == pytest.approx(tiny.meta["scaling_factor"])
    z = encode_images(parts, torch.rand(2, 3, 16, 16), torch.Generator().manual_seed(0))
    assert z.shape == (2, 4, 8, 8) and 0.2 < float(z.std()) < 5  # about unit variance after scaling
    images = prompt_samples(parts, tiny.meta["template"], "clean", "7", SampleSettings(2, 2, 3.0),
                            torch.Generator().manual_seed(0))
    assert images.shape == (2, 3, 16, 16) and 0 <= float(images.min()) and float(images.max()) <= 1
    assert (tiny.path / "samples.png").is_file()
    assert json.loads((tiny.path / "fedhet_ldm.json").read_text())["steps"] == {"vae": 20, "unet": 20}


def test_the_same_settings_are_found_and_other_settings_refused(tiny: LDMPretrained, capsys) -> None:
    again = pretrain_ldm(load_pretrain_config(None, TINY), tiny.path, progress=False)
    assert not again.trained and again.meta["key"] == tiny.meta["key"]
    assert main(["ldm", "pretrain", *TINY, "--out", str(tiny.path), "-q"]) == 0
    assert "found" in capsys.readouterr().out
    assert main(["ldm", "pretrain", *TINY, "unet.ema_decay=0.99", "--out", str(tiny.path), "-q"]) == 2
    err = capsys.readouterr().err
    assert "holds an LDM pretrained with other settings" in err and "--overwrite" in err


def test_a_resumed_pretraining_equals_an_uninterrupted_one(tiny: LDMPretrained, tmp_path: Path, monkeypatch) -> None:
    cfg, out = load_pretrain_config(None, TINY), tmp_path / "resumed"
    first = pretrain_ldm(cfg, out, progress=False, stop_after=13)  # inside the VAE stage
    assert not first.finished and not out.exists() and (work_dir(out) / "state.pt").is_file()
    with pytest.raises(FedhetError, match="--resume to continue"):
        pretrain_ldm(cfg, out, progress=False)
    with pytest.raises(CheckpointError, match="other settings"):
        pretrain_ldm(load_pretrain_config(None, [*TINY, "unet.lr=0.001"]), out, resume=True, progress=False)
    real_step = LDMTrainer._unet_step

    def killed_at_7(self: LDMTrainer, step: int, generator: torch.Generator) -> float:
        if step == 7:  # after the periodic save at UNet step 5: steps 5 and 6 are lost and made again
            raise KeyboardInterrupt
        return real_step(self, step, generator)

    monkeypatch.setattr(LDMTrainer, "_unet_step", killed_at_7)
    with pytest.raises(KeyboardInterrupt):
        pretrain_ldm(cfg, out, resume=True, progress=False)
    monkeypatch.setattr(LDMTrainer, "_unet_step", real_step)
    assert torch.load(work_dir(out) / "state.pt", weights_only=True)["step"] == 5
    done = pretrain_ldm(cfg, out, resume=True, progress=False)
    assert done.finished and not work_dir(out).exists()
    for name in WEIGHTS:
        assert (out / name).read_bytes() == (tiny.path / name).read_bytes(), f"{name} differs after resuming"
    assert _losses(out) == _losses(tiny.path)


def test_the_samples_command_writes_a_png_grid(tiny: LDMPretrained, tmp_path: Path) -> None:
    from PIL import Image

    png = tmp_path / "grid.png"
    assert main(["ldm", "samples", str(tiny.path), "--out", str(png), "--per-prompt", "2", "--steps", "2",
                 "--num-threads", "1"]) == 0
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 10 * 64 and image.height > 2 * 2 * 64


@pytest.mark.parametrize("args, message", [
    (["vae.steps=1", "unet.steps=1", "pool=[{dataset: digits, domain: mnist, word: mnist}]", "data_root=/nonexistent"],
     "data_root '/nonexistent' is not a folder"),
    (["pool=[{dataset: offline_digits, domain: cleen, word: clean}]"], "did you mean 'clean'"),
    (["image_size=18"], "must be a multiple of 16"),
    (["unet.step=5"], "did you mean 'steps'"),
])
def test_bad_settings_are_one_clear_error(args: list[str], message: str, tmp_path: Path, capsys) -> None:
    assert main(["ldm", "pretrain", *args, "--out", str(tmp_path / "out"), "-q"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not work_dir(tmp_path / "out").exists()


def test_missing_data_root_names_fedhet_data(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("FEDHET_DATA", raising=False)
    pool = "pool=[{dataset: digits, domain: mnist, word: mnist}]"
    assert main(["ldm", "pretrain", pool, "--out", str(tmp_path / "out"), "-q"]) == 2
    assert "FEDHET_DATA" in capsys.readouterr().err


def test_bad_paths_and_checkpoints_are_one_clear_error(tiny: LDMPretrained, tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["ldm", "pretrain", *TINY, "--out", str(a_file), "-q"]) == 2
    assert "is a file" in capsys.readouterr().err
    foreign = tmp_path / "foreign"
    (foreign / "unet").mkdir(parents=True)
    assert main(["ldm", "pretrain", *TINY, "--out", str(foreign), "--overwrite", "-q"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert main(["ldm", "samples", str(foreign), "--out", str(tmp_path / "g.png")]) == 2
    assert "written by fedhet ldm pretrain" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("fedhet_ldm.json", "vae", "text_encoder", "tokenizer", "scheduler"):
        src, dst = tiny.path / name, broken / name
        dst.symlink_to(src, target_is_directory=src.is_dir())
    assert main(["ldm", "samples", str(broken), "--out", str(tmp_path / "g.png")]) == 2
    assert "incomplete: missing unet" in capsys.readouterr().err
    tiny_unet(cross_attention_dim=32).save_pretrained(broken / "unet")  # a UNet for another text encoder
    assert main(["ldm", "samples", str(broken), "--out", str(tmp_path / "g.png")]) == 2
    assert "cross-attention dim is 32, but the text encoder's hidden size is 384" in capsys.readouterr().err
    assert main(["ldm", "samples", str(tiny.path), "--out", str(tmp_path / "g.png"), "--resume"]) == 2
    assert "--resume do(es) not apply" in capsys.readouterr().err
