"""Bad config files and overrides: one clear error, exit code 2, nothing written."""

from __future__ import annotations

import pytest

BAD_FILES = {  # name: (file content, words the error must hold)
    "not_utf8": (b"rounds: 1\nname: caf\xe9\n", ("not UTF-8", "save it with UTF-8")),
    "utf16": ("rounds: 1\n".encode("utf-16"), ("not UTF-8",)),
    "empty": ("", ("is empty", "{}")),
    "blank_lines": ("\n\n   \n", ("is empty", "{}")),
    "only_comments": ("# nothing here\n# still nothing\n", ("is empty", "{}")),
    "yaml_null": ("~\n", ("is empty",)),
    "duplicate_top_key": ("rounds: 1\nseed: 0\nrounds: 2\n", ("'rounds'", "twice", "line 1", "line 3", "keep one")),
    "duplicate_nested_key": ("train:\n  lr: 0.1\n  lr: 0.2\n", ("'lr'", "twice", "line 2", "line 3")),
    "duplicate_flow_key": ("model: {name: small_cnn, name: mlp}\n", ("'name'", "twice")),
    "duplicate_section": ("train: {lr: 0.1}\ntrain: {batch_size: 8}\n", ("'train'", "twice")),
    "bad_indent": ("train:\n  lr: 0.1\n batch_size: 8\n", ("not valid YAML", "line 3")),
    "tab_indent": ("train:\n\tlr: 0.1\n", ("not valid YAML", "line 2")),
    "unclosed_flow": ("model: {name: small_cnn\n", ("not valid YAML",)),
    "python_tag": ("rounds: !!python/object:os.system echo\n", ("not valid YAML",)),
    "top_level_list": ("- rounds\n- 1\n", ("mapping at the top level",)),
    "top_level_scalar": ("fedavg\n", ("mapping at the top level",)),
    "unknown_key": ("rounds: 1\nrunds: 2\n", ("unknown config key 'runds'", "did you mean 'rounds'")),
    "unknown_nested_key": ("train:\n  lrr: 0.1\n", ("train.lrr", "did you mean 'lr'")),
    "section_not_mapping": ("train: 0.1\n", ("train", "expected a mapping")),
    "int_as_string": ("rounds: many\n", ("rounds", "expected an integer")),
    "bool_as_int": ("rounds: true\n", ("rounds", "expected an integer")),
    "negative_lr": ("train: {lr: -0.1}\n", ("train.lr must be > 0",)),
    "fraction_above_one": ("data: {fraction: 2}\n", ("data.fraction", "(0, 1]")),
    "unknown_method": ("method: fedavgg\n", ("unknown method 'fedavgg'", "did you mean 'fedavg'")),
    "unknown_dataset": ("data: {dataset: pcas}\n", ("pcas", "did you mean 'pacs'")),
    "extends_missing": ("extends: nowhere.yaml\n", ("nowhere.yaml", "not found", "extended by")),
    "extends_not_a_path": ("extends: [a, b]\n", ("extends must be a file path",)),
    "extends_itself": ("extends: extends_itself.yaml\n", ("extends itself",)),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_config_file(battery, name: str) -> None:
    content, words = BAD_FILES[name]
    cfg = battery.write(f"{name}.yaml", content)
    battery.finished_run()
    battery.fails(["run", str(cfg), "--quiet"], *words, code=2)
    assert not (battery.root / "runs").exists()


def test_config_path_is_a_folder(battery) -> None:
    (battery.root / "configs").mkdir()
    battery.fails(["run", "configs", "--quiet"], "'configs' is a folder", "YAML file")


def test_config_file_missing(battery) -> None:
    battery.fails(["run", "nope.yaml", "--quiet"], "'nope.yaml'", "not found", "configs/")


def test_config_broken_symlink(battery) -> None:
    (battery.root / "link.yaml").symlink_to(battery.root / "gone.yaml")
    battery.fails(["run", "link.yaml", "--quiet"], "link.yaml", "not found")


@pytest.mark.parametrize("parent, words", [
    ("", ("base.yaml", "is empty", "extended by")),
    ("rounds: 1\nrounds: 2\n", ("base.yaml", "'rounds'", "twice")),
    (b"\xff\xfe", ("base.yaml", "not UTF-8")),
])
def test_bad_extended_file(battery, parent: str | bytes, words: tuple[str, ...]) -> None:
    battery.write("base.yaml", parent)
    cfg = battery.write("child.yaml", "extends: base.yaml\nrounds: 1\n")
    battery.fails(["run", str(cfg), "--quiet"], *words)


def test_explicit_empty_mapping_runs_the_defaults(battery) -> None:
    """`{}` is the documented way to ask for the built-in defaults (an empty file is an error)."""
    cfg = battery.write("defaults.yaml", "{}\n")
    battery.succeeds(["run", str(cfg), "--quiet", *battery.tiny])


BAD_OVERRIDES = {  # name: (overrides, words)
    "duplicate": (["train.lr=0.1", "train.lr=0.2"], ("'train.lr' is given twice", "give it once")),
    "duplicate_same_value": (["rounds=1", "rounds=1"], ("'rounds' is given twice",)),
    "duplicate_spaced_key": (["seed=1", "seed =2"], ("'seed' is given twice",)),
    "empty_key": (["=3"], ("empty key", "train.lr=0.05")),
    "empty_key_part": (["train..lr=0.1"], ("empty part", "section.key=value")),
    "trailing_dot": (["train.=0.1"], ("empty part",)),
    "bad_yaml_value": (["model.args={width: 8"], ("model.args", "not valid YAML", "quote")),
    "duplicate_key_in_value": (["model.args={width: 8, width: 9}"], ("'width'", "twice")),
    "not_a_section": (["rounds.x=1"], ("'rounds' is not a section",)),
    "unknown_key": (["trian.lr=0.1"], ("unknown config key 'trian'", "did you mean 'train'")),
    "bad_type": (["train.batch_size=big"], ("train.batch_size", "expected an integer")),
    "negative_seed": (["seed=-1"], ("seed must be >= 0",)),
}


@pytest.mark.parametrize("name", list(BAD_OVERRIDES))
def test_bad_override(battery, name: str) -> None:
    overrides, words = BAD_OVERRIDES[name]
    battery.finished_run()
    battery.fails(["run", "--quiet", *overrides], *words, code=2)
    assert not (battery.root / "runs").exists()


def test_override_and_config_file_keys_may_differ(battery) -> None:
    """Not a duplicate: a key in the file and the same key as an override (the override wins)."""
    cfg = battery.tiny_config(extra="seed: 0\n")
    result = battery.succeeds(["run", str(cfg), "--quiet", "seed=1", "rounds=1"])
    assert "seed1" in result.out
