"""Golden runs (issue 14 item 5): the code reproduces the numbers recorded in golden.json (docs/golden.md).

Each case is re-run in tmp_path and compared with its recording: bit for bit when this machine's fingerprint
(torch, numpy, CPU capability, architecture, Python) equals the recording's, else within the tolerance stated in
golden_compare.py (per tier); a failure names the case, the mode, and the first differing metric field or tensor.
The Flower simulation cases (12-19 s each here, mostly Ray start-up) are marked `slow`: run them with `-m slow`.
Their numbers equal the in-process `fedbn` and `ditto_sampled` cases' (checked on the recording below), and
the default suite asserts Flower == in-process for every method (tests/runtimes/test_flower_interop.py)
and on Ray once (tests/runtimes/test_flower_faults.py).

Off the recording machine the float32 BatchNorm cases are a smoke check only; the float64 tier (golden_f64.py:
21 cases in float64, golden_f64.json) is compared at 1e-9 on every machine, the check that holds on any x86 CPU.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from golden import golden_f64
from golden.golden_cases import BASE, CASES, GoldenCase
from golden.golden_compare import TIERS, compare, mode_of
from golden.golden_runs import machine, run_case

from fedhet.algorithms import ALGORITHMS

GOLDEN = Path(__file__).resolve().parent / "golden.json"
GOLDEN_F64 = GOLDEN.with_name("golden_f64.json")
RECORD_ALL = "python tests/golden/record.py"
RECORD = f"{RECORD_ALL} --only"
FLOAT64_MODE = "float64 tier (on any x86 machine; " + TIERS["float64"].describe("float64") + ")"


def _load(path: Path, record: str) -> dict[str, Any]:
    if not path.is_file():
        pytest.fail(f"{path} is missing: record it with `{record}` (docs/golden.md)")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return _load(GOLDEN, RECORD_ALL)


@pytest.fixture(scope="module")
def golden64() -> dict[str, Any]:
    return _load(GOLDEN_F64, f"{RECORD_ALL} --float64")


# The methods registered when golden.json was recorded (issue 14): each keeps a case. A method added later is
# one file and one hand-computed test (docs/design.md); it may add a golden case once its numbers are settled.
RECORDED_METHODS = ("all", "ditto", "ditto_mmd", "embnoise", "fedavg", "fedbabu", "fedbn", "fedproto", "fedprox",
                    "fedrep", "fraug", "moon", "partialfed", "pfedavg", "scaffold", "single")


def test_every_recorded_method_is_registered_and_has_a_case() -> None:
    gone = sorted(set(RECORDED_METHODS) - set(ALGORITHMS.names()))
    assert not gone, f"methods with golden runs are no longer registered: {gone}"
    missing = sorted(set(RECORDED_METHODS) - {c.method for c in CASES})
    assert not missing, f"methods without a golden case in tests/golden/golden_cases.py: {missing}"


def _check_definitions(data: dict[str, Any], cases: tuple[GoldenCase, ...], record: str) -> None:
    """Each case is recorded, as it is defined now (a changed case needs a new recording)."""
    assert data["base"] == list(BASE), f"golden_cases.BASE changed since the recording: run `{record}`"
    recorded = data["cases"]
    missing = [c.name for c in cases if c.name not in recorded]
    assert not missing, f"golden cases not recorded: {missing}; run `{record} --only {' '.join(missing)}`"
    stale = [c.name for c in cases if (recorded[c.name]["overrides"], recorded[c.name]["runtime"])
             != (list(c.overrides), c.runtime)]
    assert not stale, f"golden cases changed since they were recorded: {stale}; run `{record} --only {' '.join(stale)}`"
    extra = sorted(set(recorded) - {c.name for c in cases})
    assert not extra, f"the recording holds cases that are no longer defined: {extra}"


def test_recording_matches_the_case_definitions(golden: dict[str, Any], golden64: dict[str, Any]) -> None:
    _check_definitions(golden, CASES, RECORD_ALL)
    _check_definitions(golden64, golden_f64.CASES, f"{RECORD_ALL} --float64")


def test_flower_recordings_equal_inprocess(golden: dict[str, Any]) -> None:
    """The slow Flower cases are pinned by the fast in-process ones: same recorded metrics and global model."""
    cases = golden["cases"]
    for flower, inprocess in (("flower_fedbn", "fedbn"), ("flower_ditto_sampled", "ditto_sampled")):
        for part in ("metrics", "global"):
            assert cases[flower][part] == cases[inprocess][part], (flower, inprocess, part)


def test_compare_reports_the_first_difference() -> None:
    """The comparison itself: exact mode catches a 1-ulp change, tolerance mode passes noise and fails a change."""
    tight = TIERS["well_conditioned"]
    row = {"round": 1, "client": "a", "split": "test", "accuracy": 0.5, "balanced_accuracy": 0.5, "loss": 2.0,
           "num_examples": 8}
    tensor = {"dtype": "torch.float32", "shape": [2], "sha256": "ab", "sum": 1.0, "norm": 1.0}
    rec: dict[str, Any] = {"metrics": [row], "global": {"w": tensor}}
    assert compare("c", rec, copy.deepcopy(rec), None, "exact") is None
    new = copy.deepcopy(rec)
    new["metrics"][0]["loss"] = 2.0000000000000004
    msg = compare("c", rec, new, None, "exact mode")
    assert msg == "golden case 'c', exact mode: metrics row 0 (round 1, client a, split test) field 'loss': " \
                  "recorded 2.0, now 2.0000000000000004"
    assert compare("c", rec, new, tight, "tolerance") is None
    new["metrics"][0]["loss"] = 2.001
    assert "'loss'" in (compare("c", rec, new, tight, "tolerance") or "")
    new = copy.deepcopy(rec)
    new["metrics"][0]["num_examples"] = 9
    assert "'num_examples'" in (compare("c", rec, new, TIERS["batchnorm"], "tolerance") or "")
    new = copy.deepcopy(rec)
    new["global"]["w"].update(sha256="cd", sum=1.0 + 1e-9, norm=1.0 + 1e-9)
    assert "global tensor 'w': sha256" in (compare("c", rec, new, None, "exact") or "")
    assert compare("c", rec, new, tight, "tolerance") is None
    new["global"]["w"]["norm"] = 1.01
    assert "global tensor 'w': norm" in (compare("c", rec, new, tight, "tolerance") or "")
    new = copy.deepcopy(rec)
    new["metrics"][0]["accuracy"] = 0.625
    assert "'accuracy'" in (compare("c", rec, new, tight, "tolerance") or "")
    assert mode_of({"torch": "1"}, {"torch": "1"}, None, "batchnorm")[0]
    exact, why = mode_of({"torch": "1"}, {"torch": "2"}, None, "batchnorm")
    assert not exact and "torch 1 -> 2" in why and "tier batchnorm" in why
    assert not mode_of({"torch": "1"}, {"torch": "1"}, "a reason", "batchnorm")[0]
    assert mode_of({"torch": "1"}, {"torch": "2"}, None, "batchnorm", [{"torch": "2"}])[0]
    assert not mode_of({"torch": "1"}, {"torch": "2"}, None, "batchnorm", [{"torch": "3"}])[0]


def _param(case: GoldenCase) -> Any:
    marks = [pytest.mark.slow] if case.slow else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case_reproduces_recording(case: GoldenCase, golden: dict[str, Any], tmp_path: Path) -> None:
    recorded = golden["cases"].get(case.name)
    if recorded is None:
        pytest.fail(f"golden case {case.name!r} is not recorded; run `{RECORD} {case.name}`")
    exact, mode = mode_of(golden["machine"], machine(), case.tolerance_reason, case.tier,
                          golden.get("verified_exact_on", []))
    new = run_case(case, tmp_path / "run")
    problem = compare(case.name, recorded, new, None if exact else TIERS[case.tier], mode)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest.mark.parametrize("case", [pytest.param(c, id=f"float64-{c.name}") for c in golden_f64.CASES])
def test_float64_case_reproduces_recording_on_any_machine(case: GoldenCase, golden64: dict[str, Any],
                                                           tmp_path: Path) -> None:
    """The float64 tier: the same comparison on every x86 machine, to 1e-9 (golden_f64.py)."""
    recorded = golden64["cases"].get(case.name)
    if recorded is None:
        pytest.fail(f"float64 case {case.name!r} is not recorded; run `{RECORD_ALL} --float64 --only {case.name}`")
    with golden_f64.float64_mode():
        new = run_case(case, tmp_path / "run")
    problem = compare(case.name, recorded, new, TIERS["float64"], FLOAT64_MODE)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
