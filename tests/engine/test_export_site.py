"""`fedhet adapt RUN --data PATH`: a site that joins after training adapts on its own data (its training split,
evaluated on its test split), joins novel.json and exports its adapted model; bad site data is one clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import fedhet
from fedhet.config import DataConfig, load_config
from fedhet.data import build_federated_data
from fedhet.data.examples import write_example_csv, write_example_imagefolder
from fedhet.engine.evaluation import evaluate
from fedhet.errors import FedhetError
from fedhet.launch.adapt import adapt_run
from fedhet.launch.export import export_run
from fedhet.launch.run import run_experiment
from fedhet.launch.site import site_data_config

TINY = ["rounds=2", "train.local_steps=3", "train.batch_size=8", "train.lr=0.05", "run.num_threads=1",
        "run.quiet=true", "novel.epochs=2", "seed=0"]
IMAGES = ["data.dataset=imagefolder", "data.image_size=16", "data.test_fraction=0.25", "model.name=small_cnn",
          "model.args={width: 4}", "data.augment=false"]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished FedAvg run on two domains of the example shapes (plain, inverted), and the held-back third
    domain (textured, split layout) as the late site's folder."""
    tmp = tmp_path_factory.mktemp("site")
    root = write_example_imagefolder(tmp / "shapes", per_class=16, size=16)
    site = tmp / "sites" / "textured"
    site.parent.mkdir()
    shutil.move(root / "textured", site)
    cfg = load_config(None, [*IMAGES, f"data.root={root}", *TINY, "method=fedavg"])
    return run_experiment(cfg, tmp / "run", progress=False).run_dir, site


def _site_test(run: Path, site: Path) -> object:
    """The site's test split, read independently of launch/site.py: the run's data settings on its folder."""
    cfg = load_config(run / "config.yaml", [f"data.root={site.parent}", f"data.domains=[{site.name}]"])
    return build_federated_data(cfg.data, cfg.seed).clients[0].test


def test_a_late_site_adapts_on_its_own_data_and_exports(shapes: tuple[Path, Path], tmp_path: Path) -> None:
    run, site = shapes
    swapped = tmp_path / "swapped"  # the same images with two labels swapped: another site, other results
    shutil.copytree(site, swapped)
    for split in ("train", "test"):
        (swapped / split / "circle").rename(swapped / split / "tmp")
        (swapped / split / "square").rename(swapped / split / "circle")
        (swapped / split / "tmp").rename(swapped / split / "square")
    a = adapt_run(run, [], data=site, name="clinic", export=tmp_path / "clinic")
    b = adapt_run(run, [], data=swapped, export=tmp_path / "swapped_export")
    novel = json.loads((run / "novel.json").read_text())
    assert {"all@site=clinic", "all@site=swapped"} <= set(novel)  # merged, one entry per site
    assert novel["all@site=clinic"]["clients"][0]["client"] == "clinic" and len(a["mean_accuracy"]) == 3
    weights = [torch.load(tmp_path / f / "clients" / f"{n}.pt", weights_only=True)
               for f, n in (("clinic", "clinic"), ("swapped_export", "swapped"))]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # each trained on its own data
    glob = fedhet.load_exported(export_run(run, tmp_path / "run_export"))
    for result, folder, export, name in ((a, site, "clinic", "clinic"), (b, swapped, "swapped_export", "swapped")):
        test = _site_test(run, folder)
        accuracy = result["clients"][0]["accuracy"]
        assert evaluate(glob, test, CPU)["accuracy"] == accuracy[0]  # type: ignore[arg-type]  # before: the run's
        adapted = fedhet.load_exported(tmp_path / export, client=name)
        assert evaluate(adapted, test, CPU)["accuracy"] == accuracy[-1]  # type: ignore[arg-type]
    manifest = json.loads((tmp_path / "clinic" / "export.json").read_text())
    assert manifest["site"]["data"] == str(site.resolve()) and manifest["global"]["file"] is None


def _copy(site: Path, to: Path) -> Path:
    shutil.copytree(site, to)
    return to


def test_bad_site_data_is_one_clear_error(shapes: tuple[Path, Path], tmp_path: Path) -> None:
    run, site = shapes
    extra = _copy(site, tmp_path / "extra")
    for split in ("train", "test"):
        shutil.copytree(extra / split / "circle", extra / split / "star")
    with pytest.raises(FedhetError, match=r"has 4 classes \(circle, square, star, triangle\), the run's model has 3"):
        adapt_run(run, [], data=extra)
    renamed = _copy(site, tmp_path / "renamed")
    for split in ("train", "test"):
        (renamed / split / "triangle").rename(renamed / split / "tri")
    with pytest.raises(FedhetError, match="tri in the site, triangle in the run"):
        adapt_run(run, [], data=renamed)
    with pytest.raises(FedhetError, match="'.*nowhere' not found"):
        adapt_run(run, [], data=tmp_path / "nowhere")
    with pytest.raises(FedhetError, match="already has a client named 'plain'.*--name"):
        adapt_run(run, [], data=site, name="plain")
    with pytest.raises(FedhetError, match="--name and --export go with --data"):
        adapt_run(run, [], name="x")
    bare = tmp_path / "bare"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(FedhetError, match="with a checkpoint"):
        adapt_run(bare, [], data=site)
    assert not (tmp_path / "extra" / "novel.json").exists()


def test_the_cli_says_a_bad_site_in_one_line(shapes: tuple[Path, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from fedhet.cli import main

    run, _ = shapes
    assert main(["adapt", str(run), "--data", str(tmp_path / "nowhere"), "--name", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not found" in err[0] and "Traceback" not in err[0]


def test_a_csv_site_must_have_the_runs_columns(tmp_path: Path) -> None:
    table = write_example_csv(tmp_path / "hospitals.csv", rows_per_hospital=30)
    lines = table.read_text().splitlines()
    cfg = load_config(None, ["data.dataset=csv", f"data.root={table}", "data.test_fraction=0.3",
                             "data.options={label: label, client_column: hospital, categorical: [smoker]}",
                             "model.name=mlp", "model.args={hidden: [8], norm: bn}", *TINY, "method=fedbn"])
    run = run_experiment(cfg, tmp_path / "run", progress=False).run_dir
    west = tmp_path / "west.csv"
    west.write_text("\n".join([lines[0], *(r.replace("north", "west") for r in lines[1:31])]) + "\n")
    result = adapt_run(run, [], data=west)
    assert result["clients"][0]["client"] == "west" and result["part"] == "personal"  # FedBN: its BN adapts
    wide = tmp_path / "wide.csv"
    wide.write_text("\n".join([lines[0] + ",weight", *(r.replace("north", "west") + ",70" for r in lines[1:31])]))
    with pytest.raises(FedhetError, match=r"features \(5,\), the run's model takes \(4,\)"):
        adapt_run(run, [], data=wide)


def test_a_builtin_dataset_run_takes_no_site_data(tmp_path: Path) -> None:
    with pytest.raises(FedhetError, match="dataset 'offline_digits'.*imagefolder or csv.*novel.holdout"):
        site_data_config(DataConfig(dataset="offline_digits"), tmp_path)
    with pytest.raises(FedhetError, match="is a file; for an imagefolder run give the site's folder"):
        (tmp_path / "f.png").write_bytes(b"")
        site_data_config(DataConfig(dataset="imagefolder"), tmp_path / "f.png")


@pytest.mark.slow
def test_an_adaptfed_site_exports_its_generated_weights(shapes: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("timm")
    _, site = shapes
    focal = ["model.name=focalnet", "model.args={embed_dim: 8, depths: [2], patch_size: 4}"]
    cfg = load_config(None, [*IMAGES, f"data.root={site.parent.parent / 'shapes'}", *TINY, *focal, "method=adaptfed"])
    run = run_experiment(cfg, tmp_path / "run", progress=False).run_dir
    result = adapt_run(run, ["novel.part=embedding"], data=site, export=tmp_path / "site")
    assert result["part"] == "embedding"  # z_new through the hypernetwork, exported as the weights it generates
    model = fedhet.load_exported(tmp_path / "site", client="textured")
    assert evaluate(model, _site_test(run, site), CPU)["accuracy"] == result["mean_final"]  # type: ignore[arg-type]
