"""`imagefolder` on generated PNG folders: layouts, class agreement, channels / size / normalisation, the
bad-folder errors of `fedhet.data.files` (also used by PACS / Office), and 1-round runs end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedhet.config import DataConfig, load_config
from fedhet.data import DataFileError, build_federated_data, resolve_spec
from fedhet.data.examples import write_example_imagefolder
from fedhet.data.files import read_image_folder
from fedhet.errors import ConfigError, DatasetNotFoundError

REPO = Path(__file__).resolve().parents[2]


def png(path: Path, seed: int = 0, size: tuple[int, int] = (12, 9), color: tuple[int, int, int] | None = None) -> None:
    """One RGB PNG (random pixels, or one colour)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arr = (np.broadcast_to(np.array(color, np.uint8), (size[1], size[0], 3)) if color is not None
           else rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    Image.fromarray(np.ascontiguousarray(arr)).save(path)


def tree(root: Path, layout: dict[str, dict[str, int]]) -> Path:
    """layout: '<domain>[/<split>]' -> {class: number of images}."""
    for folder, classes in layout.items():
        for cls, n in classes.items():
            for i in range(n):
                png(root / folder / cls / f"{i}.png", seed=hash((folder, cls, i)) % 2**32)
    return root


def cfg(root: Path, **kw) -> DataConfig:
    base = dict(dataset="imagefolder", root=str(root), image_size=8, augment=False)
    return DataConfig(**{**base, **kw})


def test_flat_layout_gives_per_domain_clients_with_a_seeded_split(tmp_path: Path) -> None:
    tree(tmp_path, {d: {"cat": 10, "dog": 10} for d in ("b_domain", "a_domain")})
    fed = build_federated_data(cfg(tmp_path, test_fraction=0.2), seed=0)
    assert [c.name for c in fed.clients] == ["a_domain", "b_domain"] and fed.classes == ["cat", "dog"]
    assert [(len(c.train), len(c.test)) for c in fed.clients] == [(16, 4), (16, 4)]
    assert sorted(fed.clients[0].test.labels.tolist()) == [0, 0, 1, 1]  # stratified
    again = build_federated_data(cfg(tmp_path, test_fraction=0.2), seed=0)
    other = build_federated_data(cfg(tmp_path, test_fraction=0.2), seed=1)
    first = fed.clients[0].test.parts[0].index
    assert np.array_equal(first, again.clients[0].test.parts[0].index)
    assert not np.array_equal(first, other.clients[0].test.parts[0].index)


def test_split_layout_uses_the_given_train_and_test(tmp_path: Path) -> None:
    tree(tmp_path, {"given/train": {"cat": 7, "dog": 5}, "given/test": {"cat": 2, "dog": 3},
                    "flat": {"cat": 10, "dog": 10}})
    fed = build_federated_data(cfg(tmp_path, test_fraction=0.5), seed=0)
    by = {c.name: c for c in fed.clients}
    assert (len(by["given"].train), len(by["given"].test)) == (12, 5)  # test_fraction does not apply
    assert sorted(by["given"].test.labels.tolist()) == [0, 0, 1, 1, 1]
    assert (len(by["flat"].train), len(by["flat"].test)) == (10, 10)


def test_split_layout_folder_errors(tmp_path: Path) -> None:
    tree(tmp_path / "one", {"d/train": {"cat": 2}, "d/val": {"cat": 2}})
    with pytest.raises(DataFileError, match=r"'.*d' holds train, val.*layout: flat"):
        build_federated_data(cfg(tmp_path / "one"), seed=0)
    tree(tmp_path / "two", {"d/train": {"cat": 2, "dog": 2}, "d/test": {"dog": 2}})
    with pytest.raises(DataFileError, match="class 'cat' is missing from domain 'd', split 'test'"):
        build_federated_data(cfg(tmp_path / "two"), seed=0)
    tree(tmp_path / "three", {d: {"train": 3, "test": 3} for d in ("a", "b")})  # classes named train / test
    flat = build_federated_data(cfg(tmp_path / "three", options={"layout": "flat"}), seed=0)
    assert flat.classes == ["test", "train"] and len(flat.clients[0].train) + len(flat.clients[0].test) == 6


def test_missing_class_is_an_error_naming_class_and_domain_unless_allowed(tmp_path: Path) -> None:
    tree(tmp_path, {"art": {"cat": 4, "dog": 4, "fox": 4}, "photo": {"cat": 4, "fox": 4}})
    with pytest.raises(DataFileError, match="class 'dog' is missing from domain 'photo'.*allow_missing_classes"):
        build_federated_data(cfg(tmp_path), seed=0)
    fed = build_federated_data(cfg(tmp_path, options={"allow_missing_classes": True}), seed=0)
    assert fed.classes == ["cat", "dog", "fox"] and fed.num_classes == 3
    photo = next(c for c in fed.clients if c.name == "photo")
    assert set(photo.train.labels.tolist()) == {0, 2}  # labels keep the shared class index
    only = build_federated_data(cfg(tmp_path, domains=["photo"]), seed=0)  # checked over the chosen domains
    assert only.classes == ["cat", "fox"]


def test_class_name_case_mismatch_suggests_the_near_name(tmp_path: Path) -> None:
    tree(tmp_path, {"a": {"Cat": 3}, "b": {"cat": 3}})
    with pytest.raises(DataFileError, match="class 'cat' is missing from domain 'a' .*did you mean 'Cat'"):
        build_federated_data(cfg(tmp_path), seed=0)


def test_channels_size_and_grey_conversion(tmp_path: Path) -> None:
    for d in ("a", "b"):
        for i in range(4):
            png(tmp_path / d / "red" / f"{i}.png", size=(20, 13), color=(255, 0, 0))
            png(tmp_path / d / "blue" / f"{i}.png", size=(20, 13), color=(0, 0, 255))
    fed = build_federated_data(cfg(tmp_path, image_size=10, options={"channels": 1, "normalize": "none"}), seed=0)
    assert fed.input_shape == (1, 10, 10)
    x, y = fed.clients[0].train[0]
    assert x.shape == (1, 10, 10) and x.dtype == torch.float32
    grey = {0: 29 / 255, 1: 76 / 255}  # PIL's L = (299 R + 587 G + 114 B) / 1000: blue 29, red 76
    assert torch.allclose(x, torch.full_like(x, grey[int(y)]), atol=1 / 255)
    rgb = build_federated_data(cfg(tmp_path, image_size=12, options={"normalize": "none"}), seed=0)
    x, y = rgb.clients[0].train[0]
    assert rgb.input_shape == (3, 12, 12) and x.shape == (3, 12, 12)
    assert torch.allclose(x[:, 5, 5], torch.tensor([1.0, 0.0, 0.0] if rgb.classes[int(y)] == "red" else [0, 0, 1.0]))


def test_normalisations(tmp_path: Path) -> None:
    tree(tmp_path, {d: {"cat": 6, "dog": 6} for d in ("a", "b")})
    fed = build_federated_data(cfg(tmp_path, options={"normalize": "client"}), seed=0)
    x = torch.stack([fed.clients[0].train[i][0] for i in range(len(fed.clients[0].train))])
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)  # fitted on this training split
    assert torch.allclose(x.std(dim=(0, 2, 3), unbiased=False), torch.ones(3), atol=1e-3)
    raw = build_federated_data(cfg(tmp_path, options={"normalize": "none"}), seed=0).clients[0].train[0][0]
    fixed = build_federated_data(cfg(tmp_path, options={"normalize": "fixed", "mean": [0.5, 0.5, 0.5],
                                                         "std": [0.25, 0.25, 0.25]}), seed=0).clients[0].train[0][0]
    assert torch.allclose(fixed, (raw - 0.5) / 0.25, atol=1e-5)
    imagenet = build_federated_data(cfg(tmp_path), seed=0).clients[0].train[0][0]
    assert torch.allclose(imagenet[0], (raw[0] - 0.485) / 0.229, atol=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"chanels": 1}, "unknown config key 'data.options.chanels' .*did you mean 'channels'"),
    ({"channels": 2}, "channels must be 1 .* or 3"),
    ({"normalize": "clinet"}, "did you mean 'client'"),
    ({"mean": [0.5, 0.5, 0.5]}, "only with normalize: fixed"),
    ({"normalize": "fixed", "mean": [0.5], "std": [0.2]}, "mean must list 3 value"),
    ({"normalize": "fixed", "mean": [0.5], "std": [0.0], "channels": 1}, "std must be > 0"),
])
def test_option_errors(tmp_path: Path, options: dict, message: str) -> None:
    cfg = load_config(None, ["data.dataset=imagefolder", f"data.root={tmp_path}"] +
                      [f"data.options.{k}={v}" for k, v in options.items()])  # config knows no dataset's options
    with pytest.raises(ConfigError, match=message):
        resolve_spec(cfg.data)  # the data layer checks them before it reads data.root (empty here)


def test_root_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reads data.root: set it"):
        build_federated_data(DataConfig(dataset="imagefolder"), seed=0)
    with pytest.raises(DatasetNotFoundError, match="is not a folder"):
        build_federated_data(cfg(tmp_path / "nope"), seed=0)
    with pytest.raises(DatasetNotFoundError, match="holds no domain folders"):
        build_federated_data(cfg(tmp_path), seed=0)
    tree(tmp_path, {d: {"cat": 3} for d in ("art", "photo")})
    with pytest.raises(ConfigError, match="did you mean 'photo'"):
        build_federated_data(cfg(tmp_path, domains=["foto"]), seed=0)


def test_usual_partitioners_and_fractions_work(tmp_path: Path) -> None:
    tree(tmp_path, {d: {"cat": 12, "dog": 12, "fox": 12} for d in ("a", "b")})
    fed = build_federated_data(cfg(tmp_path, partition="dirichlet", num_clients=3, alpha=1.0), seed=0)
    assert [c.name for c in fed.clients] == ["client0", "client1", "client2"]
    two = build_federated_data(cfg(tmp_path, clients_per_domain=2, fraction=0.5), seed=0)
    assert [c.name for c in two.clients] == ["a#0", "a#1", "b#0", "b#1"]
    assert sum(len(c.train) for c in two.clients) == pytest.approx(0.5 * 2 * 29, abs=4)


# ---------------------------------------------------------------- bad folders (files.py: imagefolder and PACS)
def test_junk_is_skipped_and_a_non_image_file_is_an_error_naming_it(tmp_path: Path) -> None:
    tree(tmp_path, {d: {"cat": 3, "dog": 3} for d in ("a", "b")})
    for junk in (".DS_Store", "Thumbs.db", "._0.png", "desktop.ini"):
        (tmp_path / "a" / "cat" / junk).write_bytes(b"\x00junk")
    (tmp_path / "a" / ".ipynb_checkpoints").mkdir()
    assert len(build_federated_data(cfg(tmp_path), seed=0).clients) == 2
    (tmp_path / "b" / "dog" / "notes.txt").write_text("hello")
    with pytest.raises(DataFileError, match=r"notes.txt' in class folder .* is not an image"):
        build_federated_data(cfg(tmp_path), seed=0)


def test_empty_class_folder_is_an_error_unless_allowed(tmp_path: Path) -> None:
    tree(tmp_path, {d: {"cat": 3, "dog": 3} for d in ("a", "b")})
    (tmp_path / "a" / "eel").mkdir()
    with pytest.raises(DataFileError, match=r"class folder '.*a/eel' holds no images"):
        build_federated_data(cfg(tmp_path), seed=0)
    fed = build_federated_data(cfg(tmp_path, options={"allow_missing_classes": True}), seed=0)
    assert fed.classes == ["cat", "dog"]  # an empty folder adds no class


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_image_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    tree(tmp_path, {d: {"cat": 3, "dog": 3} for d in ("a", "b")})
    bad = tmp_path / "b" / "cat" / "1.png"
    png(bad, size=(64, 64))
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a png at all")
    with pytest.raises(DataFileError, match=r"image '.*b/cat/1.png' cannot be read"):
        build_federated_data(cfg(tmp_path), seed=0)


def test_builtin_folder_datasets_get_the_same_errors(tmp_path: Path) -> None:
    """PACS-style reading (read_image_folder): empty class folder, non-image file, sub-folder, corrupt image."""
    dom = tmp_path / "photo"
    tree(tmp_path, {"photo": {"dog": 2, "horse": 2}})
    (dom / "house").mkdir()
    with pytest.raises(DataFileError, match=r"'.*photo/house' holds no images"):
        read_image_folder(dom, ("dog", "horse", "house"), 8)
    (dom / "house").rmdir()
    x, y = read_image_folder(dom, ("dog", "horse", "house"), 8)  # an absent class folder: a warning only
    assert x.shape == (4, 3, 8, 8) and y.tolist() == [0, 0, 1, 1]
    (dom / "dog" / "sub").mkdir()
    with pytest.raises(DataFileError, match="is a folder inside class folder"):
        read_image_folder(dom, ("dog", "horse"), 8)
    (dom / "dog" / "sub").rmdir()
    (dom / "dog" / "labels.csv").write_text("a,b\n")
    with pytest.raises(DataFileError, match=r"dog/labels.csv' in class folder .* is not an image"):
        read_image_folder(dom, ("dog", "horse"), 8)
    (dom / "dog" / "labels.csv").unlink()
    (dom / "horse" / "x.jpg").write_bytes(b"\xff\xd8\xff broken jpeg")
    with pytest.raises(DataFileError, match=r"horse/x.jpg' cannot be read"):
        read_image_folder(dom, ("dog", "horse"), 8)


# ---------------------------------------------------------------- end to end
def test_shipped_example_config_runs_one_round(tmp_path: Path) -> None:
    from fedhet.launch.run import run_experiment

    write_example_imagefolder(tmp_path / "data", per_class=8)
    conf = load_config(REPO / "configs" / "imagefolder_example.yaml",
                       [f"data.root={tmp_path / 'data'}", "rounds=1", "run.quiet=true", "run.num_threads=1",
                        f"run.out_dir={tmp_path / 'runs'}", "data.options.channels=1"])
    result = run_experiment(conf, tmp_path / "run", progress=False)
    assert set(result.final) == {"inverted", "plain", "textured", "avg"}
    assert (tmp_path / "run" / "summary.json").is_file()


def test_sweep_check_plan_reads_classes_and_channels(tmp_path: Path) -> None:
    from fedhet.launch.sweep import check_plan, plan_sweep

    write_example_imagefolder(tmp_path / "data", per_class=2)
    conf = load_config(REPO / "configs" / "imagefolder_example.yaml",
                       [f"data.root={tmp_path / 'data'}", "data.options.channels=1", f"run.out_dir={tmp_path}"])
    assert [status for _, status in check_plan(plan_sweep(conf))] == ["new"] * 3
