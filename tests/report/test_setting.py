"""Every generated page says what stands in for the paper's setting, from the runs' own configs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import yaml

from fedhet.report import write_report
from fedhet.report.setting import NONE_DECLARED, setting_section


def _config(dataset: str, stand_in: str = "", rounds: int = 20, seed: int = 0) -> dict[str, object]:
    return {"stand_in": stand_in, "seed": seed, "rounds": rounds, "data": {"dataset": dataset},
            "model": {"name": "small_cnn"}, "train": {"local_steps": 10, "batch_size": 32}}


def test_note_and_setting_come_from_the_configs() -> None:
    text = setting_section([_config("digits", "SynthDigits for SVHN", seed=s) for s in (0, 1, 2)])
    assert "**Stand-ins.** SynthDigits for SVHN" in text
    assert "**Setting (digits).** model small_cnn; 20 rounds x 10 local steps, batch 32; seeds 0, 1, 2." in text
    assert NONE_DECLARED not in text


def test_missing_note_is_said_not_hidden() -> None:
    assert setting_section([_config("digits")]).splitlines()[2] == NONE_DECLARED
    text = setting_section([_config("digits", "SynthDigits for SVHN"), _config("pacs")])
    assert "**Stand-ins (digits).** SynthDigits for SVHN" in text
    assert "**Stand-ins (pacs).** None declared" in text


def test_differing_budgets_are_all_shown() -> None:
    text = setting_section([_config("digits", rounds=20), _config("digits", rounds=4)])
    assert "20 rounds" in text and "4 rounds" in text


def test_report_prints_the_note_under_its_title(make_run, tmp_path: Path) -> None:
    run = make_run("fedavg", 0, {"c0": 0.5, "avg": 0.5}, curve=[0.5])
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "stand_in": "small_cnn for ResNet-18"}))
    md = write_report([run], tmp_path / "out").markdown.read_text().splitlines()
    assert md[0] == "# fedhet report"
    assert "**Stand-ins.** small_cnn for ResNet-18" in md[1:6]


def _stamp_module() -> ModuleType:
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("stamp_stand_ins", root / "benchmarks" / "stamp_stand_ins.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stamp_fills_a_generated_block_and_is_idempotent() -> None:
    stamp = _stamp_module()
    page = "# Table\n\n" + setting_section([_config("digits")]) + "\n| a |\n"
    once = stamp.stamped(page, "**Stand-ins.** X for Y\n\n*(runs predate the `stand_in:` key)*")
    assert "**Stand-ins.** X for Y" in once and NONE_DECLARED not in once
    assert "**Setting (digits).**" in once  # the generated setting lines stay
    again = stamp.stamped(once, "**Stand-ins.** X for Y\n\n*(runs predate the `stand_in:` key)*")
    assert again == once
    declared = "# T\n\n" + setting_section([_config("digits", "from the runs")])
    assert stamp.stamped(declared, "**Stand-ins.** stale\n\n*(predate the `stand_in:` key)*") == declared


def test_every_generated_results_page_has_its_block() -> None:
    assert _stamp_module().main(["--check"]) == 0
