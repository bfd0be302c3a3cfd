"""benchmarks/privacy_robustness.py (issue 41 item 7): sigma meets each target epsilon on fedhet's accountant, every
section b defense outvotes its attackers by fedhet's own check, the page's numbers from run directories (attackers
left out, domains averaged, missing seeds and cells said), and one smoke cell end to end, resumed on a second call."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fedhet.config import ServerConfig
from fedhet.core.dp_accountant import epsilon
from fedhet.engine.attacks import check_defense

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = load("privacy_robustness")
page = load("privacy_robustness_page")


@pytest.mark.parametrize("target", [1.0, 4.0, 8.0])
def test_sigma_spends_the_target_epsilon(target: float) -> None:
    sigma = bench.noise_for(target, 0.25, 30)
    spent = epsilon(0.25, sigma, 30, bench.DP_DELTA)
    assert spent <= target and spent == pytest.approx(target, rel=1e-3)


def test_section_a_sigma_per_epsilon_and_no_dp_at_infinity() -> None:
    cells = bench.section_a(bench.SETTINGS["offline"])
    fedavg = {c.label: c.variant for c in cells if c.variant["method"] == "fedavg"}
    sigmas = [fedavg[f"fedavg_eps{e}"]["privacy"]["dp"]["noise_multiplier"] for e in ("1", "4", "8")]
    assert sigmas == sorted(sigmas, reverse=True) and "privacy" not in fedavg["fedavg_epsinf"]
    assert len(cells) == 20


@pytest.mark.parametrize("key", ["offline", "digits"])
def test_section_b_defenses_outvote_the_attackers(key: str) -> None:
    setting = bench.SETTINGS[key]
    assert not any(a.startswith(setting.outlier + "#") for a in setting.attackers)  # the outlier domain is honest
    for cell in bench.section_b(setting):
        check_defense(ServerConfig(**cell.variant["server"]), len(setting.attackers), 10)  # 10 clients per round


def fake_run(runs: Path, cell: object, seed: int, accuracies: dict[str, float], attackers: list[str],
             privacy: dict[str, object] | None = None) -> None:
    run = runs / cell.name / "offline_digits" / cell.label / f"seed{seed}"  # type: ignore[attr-defined]
    run.mkdir(parents=True)
    final = {c: {"accuracy": a} for c, a in accuracies.items()} | {"avg": {"accuracy": 0.0}}
    summary = {"final": final, **({"attack": {"clients": attackers}} if attackers else {})}
    (run / "summary.json").write_text(json.dumps(summary))
    if privacy:
        (run / "privacy.json").write_text(json.dumps(privacy))


def test_page_reads_honest_domains_and_says_what_is_pending(tmp_path: Path) -> None:
    setting = bench.smoke(bench.SETTINGS["offline"])
    cells = [*bench.plan("bd", [setting]), bench.Cell("a", setting, "fedbn_epsinf", {"method": "fedbn"})]
    by = {(c.section, c.label): c for c in cells}
    clients = {"clean#0": 0.1, "clean#1": 0.8, "inverted#0": 0.6, "inverted#1": 0.5, "colored#0": 0.9}
    fake_run(tmp_path, by["b", "none-mean"], 0, clients, [])
    fake_run(tmp_path, by["b", "none-mean"], 1, clients, [])
    fake_run(tmp_path, by["b", "none-median"], 0, clients | {"inverted#0": 0.59}, [])
    fake_run(tmp_path, by["b", "sign_flip-mean"], 0, clients, ["clean#0"])
    mia = {"train_vs_test": {"avg": {"loss": {"advantage": 0.25}}}}
    fake_run(tmp_path, by["a", "fedbn_epsinf"], 0, clients, [], mia)
    out = tmp_path / "page.md"
    refused = {"pr_b_offline/label_flip-mean/seed0": "loss became nan"}
    page.write(out, cells, [0, 1], tmp_path, {"seconds": {"b": 60.0}, "refused": refused}, {"b": 3600.0})
    text = out.read_text()
    # attackers left out: clean#0 (0.1) counts in the mean without an attack, not under sign_flip
    assert "| none | mean | 58.0 ± 0.0 | 45.0 ± 0.0 | 55.0 ± 0.0 | +0.0 |" in text  # worst: clean (0.1+0.8)/2
    assert "| sign_flip | mean | 70.0 (1 of 2 seeds) | 55.0 (1 of 2 seeds) | 55.0 (1 of 2 seeds) | +10.0 |" in text
    assert "| none | median | 57.8 (1 of 2 seeds) | 45.0 (1 of 2 seeds) | 54.5 (1 of 2 seeds) | +0.0 |" in text
    assert "| none | krum | pending | pending | pending |  |" in text
    assert "| label_flip | mean | refused (below) |" in text and "`pr_b_offline/label_flip-mean/seed0`: loss" in text
    assert "offline: median (+0.0)" in text  # within 1 point of the mean's worst domain, no attack
    assert "adv 0.250 (1 of 2 seeds)" in text and "b 1.0 min" in text  # section a
    assert "statistics stay local) | pending | pending | pending | pending | pending | 0.250 (1 of 2 seeds) |" in text
    assert json.loads(out.with_suffix(".json").read_text())["seconds"] == {"b": 60.0}


@pytest.mark.slow  # ~15 s of CPU (one tiny run, the accountant's calibrations); minutes on a loaded machine
def test_smoke_cell_end_to_end_and_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # main() moves to the checkout; restored after the test
    args = ["--smoke", "--sections", "b", "--cells", "none-mean", "--runs", str(tmp_path / "runs"),
            "--out", str(tmp_path / "page.md")]
    bench.main(args)
    summary = next((tmp_path / "runs").glob("pr_b_offline/*/none-mean/seed0/summary.json"))
    stamp = summary.stat().st_mtime_ns
    text = (tmp_path / "page.md").read_text()
    assert "SMOKE RUN" in text and "| none | mean | pending" not in text and "| none | median | pending" in text
    bench.main(args)  # finished: skipped
    assert summary.stat().st_mtime_ns == stamp
