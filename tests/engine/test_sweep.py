"""Sweeps: methods x variants x seeds expand to one config per run; variants run and report under their label."""

from __future__ import annotations

import pytest

from fedhet.config import ExperimentConfig, from_dict
from fedhet.errors import ConfigError
from fedhet.launch.sweep import check_plan, plan_sweep, run_sweep
from fedhet.report.runs import load_runs
from fedhet.report.table import make_table

TINY = {"data": {"dataset": "offline_digits", "max_test_per_client": 20},
        "model": {"name": "small_cnn", "args": {"width": 8}}, "rounds": 1, "train": {"local_steps": 1}}


def _cfg(tmp_path, sweep: dict) -> ExperimentConfig:
    cfg = from_dict(ExperimentConfig, {**TINY, "name": "sw", "sweep": sweep, "run": {"out_dir": str(tmp_path)}})
    cfg.validate()
    return cfg


def test_variants_expand_with_labels_and_merged_settings(tmp_path) -> None:
    plan = plan_sweep(_cfg(tmp_path, {
        "methods": ["fedbn"], "seeds": [0, 1],
        "overrides": {"fraug": {"method_args": {"beta": 2.0}}},
        "variants": {"fraug_no_ema": {"method": "fraug", "method_args": {"use_ema": False}},
                     "fedbn_noisy": {"method": "fedbn", "data": {"input_noise_std": 0.1}}}}))
    got = [(c.method, c.variant, c.seed) for c in plan.configs]
    assert got == [("fedbn", "fedbn", 0), ("fedbn", "fedbn", 1), ("fraug", "fraug_no_ema", 0),
                   ("fraug", "fraug_no_ema", 1), ("fedbn", "fedbn_noisy", 0), ("fedbn", "fedbn_noisy", 1)]
    no_ema = plan.configs[2]
    assert no_ema.method_args == {"beta": 2.0, "use_ema": False}  # method override, then the variant
    assert plan.configs[4].data.input_noise_std == 0.1 and plan.configs[0].data.input_noise_std == 0.0
    dirs = plan.run_dirs()
    assert len(set(dirs)) == len(dirs) and dirs[2].parts[-2] == "fraug_no_ema"


def test_a_variant_of_another_method_may_drop_the_inherited_method_args(tmp_path) -> None:
    cfg = from_dict(ExperimentConfig, {**TINY, "name": "sw", "method": "fedprox", "method_args": {"mu": 0.5},
                                       "run": {"out_dir": str(tmp_path)},
                                       "sweep": {"variants": {"prox": {"method": "fedprox"},
                                                              "avg": {"method": "fedavg", "method_args": None}}}})
    plan = plan_sweep(cfg)
    assert [(c.method, c.method_args) for c in plan.configs] == [("fedprox", {"mu": 0.5}), ("fedavg", {})]


def test_cli_selection_may_name_a_variant(tmp_path) -> None:
    cfg = _cfg(tmp_path, {"methods": ["fedavg"], "variants": {"v1": {"method": "fedbn"}}})
    assert [c.variant for c in plan_sweep(cfg, methods=["v1"]).configs] == ["v1"]


@pytest.mark.parametrize("sweep, match", [
    ({"variant": {}}, "did you mean 'variants'"),
    ({"variants": {"v": 3}}, "sweep.variants must map a label"),
    ({"variants": {"a/b": {"method": "fedavg"}}}, "label may hold only"),
])
def test_bad_sweep_is_one_clear_error(tmp_path, sweep, match) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_sweep(_cfg(tmp_path, sweep))


def test_variant_runs_report_under_their_label(tmp_path) -> None:
    plan = plan_sweep(_cfg(tmp_path, {"methods": ["fedavg"],
                                      "variants": {"fedavg_lr_small": {"train": {"lr": 0.001}}}}))
    run_sweep(plan, progress=False)
    runs = load_runs(tmp_path)
    assert sorted(r.label for r in runs) == ["fedavg", "fedavg_lr_small"]
    assert {r.method for r in runs} == {"fedavg"}
    table = make_table(runs).datasets[0]
    assert table.columns == ["fedavg", "fedavg_lr_small"]


def test_check_plan_validates_every_run_without_training(tmp_path) -> None:
    cfg = _cfg(tmp_path, {"methods": ["fedavg", "fedbn"], "seeds": [0, 1]})
    checked = check_plan(plan_sweep(cfg))
    assert [(c.method, c.seed, status) for c, status in checked] == [
        ("fedavg", 0, "new"), ("fedavg", 1, "new"), ("fedbn", 0, "new"), ("fedbn", 1, "new")]
    assert not any(tmp_path.iterdir())  # nothing was run or written
    no_bn = _cfg(tmp_path, {"methods": ["fedavg", "fedbn"]})
    no_bn.model.args = {"width": 8, "norm": "none"}
    with pytest.raises(ConfigError, match="sweep run fedbn seed 0.*has none"):
        check_plan(plan_sweep(no_bn))
    bad = {"fraug_bad": {"method": "fraug", "method_args": {"class_reduction": "max"}}}
    bad_arg = _cfg(tmp_path, {"variants": bad})
    with pytest.raises(ConfigError, match="sweep run fraug_bad seed 0.*class_reduction"):
        check_plan(plan_sweep(bad_arg))


def test_a_finished_run_made_with_another_config_is_an_error_not_a_skip(tmp_path) -> None:
    cfg = _cfg(tmp_path, {"methods": ["fedavg"], "seeds": [0]})
    run_sweep(plan_sweep(cfg), progress=False)
    assert [status for _, status in check_plan(plan_sweep(cfg))] == ["finished"]
    more = from_dict(ExperimentConfig, {**cfg.to_dict(), "rounds": 2})
    assert [status for _, status in check_plan(plan_sweep(more))] == ["resume"]  # extending is not a change
    changed = from_dict(ExperimentConfig, {**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "lr": 0.5}})
    with pytest.raises(ConfigError, match=r"another config \(train.lr: 0.01 there, 0.5 now\).*another name"):
        check_plan(plan_sweep(changed))
    config_yaml = next(tmp_path.rglob("config.yaml"))  # a run made before fedhet had model.init_from
    config_yaml.write_text(config_yaml.read_text().replace("  init_from: null\n", ""))
    assert [status for _, status in check_plan(plan_sweep(cfg))] == ["finished"]  # the default: no difference
    (tmp_path / "b.pt").write_bytes(b"")
    pretrained = str(tmp_path / "b.pt")
    newer = from_dict(ExperimentConfig, {**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "init_from": pretrained}})
    with pytest.raises(ConfigError, match=r"model.init_from: None there, '.*b.pt' now"):
        check_plan(plan_sweep(newer))
