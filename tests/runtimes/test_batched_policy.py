"""Where lanes pay (runtimes/batched/policy.py, calibrate.py): measured per machine, model, batch and lane count,
cached, overridable by run.batched_min_lanes, and said in one line of the run's output."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment
from fedhet.runtimes.batched import BatchedClients
from fedhet.runtimes.batched import calibrate as calibration
from fedhet.runtimes.batched.policy import CPU_MIN_LANES, LanePolicy, Measured, bucket
from fedhet.runtimes.inprocess import InProcessClients

CPU = torch.device("cpu")
MODEL = {"method": "fedavg", "shapes": [["w", [10, 4], "torch.float32"]]}
AUTO = ["data.dataset=offline_digits", "model.name=mlp", "model.args={hidden: [8]}", "train.local_steps=2",
        "train.batch_size=8", "data.partition=dirichlet", "data.alpha=100", "data.num_clients=10", "run.quiet=true",
        "run.device=cpu", "run.num_threads=1", "run.runtime=batched"]


class Fake:
    """A calibration that answers `speedup` and counts its calls."""

    def __init__(self, speedup: float) -> None:
        self.speedup = speedup
        self.calls: list[tuple[int, int]] = []

    def __call__(self, batch_size: int, lanes: int) -> Measured:
        self.calls.append((batch_size, lanes))
        return Measured(lanes, lane_step_s=1.0, seq_step_s=self.speedup / lanes)


def policy(tmp: Path, fake: Fake, chosen: int | None = None, model: dict | None = None) -> LanePolicy:
    return LanePolicy(chosen, CPU, model or MODEL, fake, folder=tmp)


@pytest.mark.parametrize(("speedup", "pays"), [(1.4, True), (0.8, False)])
def test_the_measured_answer_decides_and_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture, speedup: float,
                                                  pays: bool) -> None:
    fake = Fake(speedup)
    with caplog.at_level("WARNING"):
        assert policy(tmp_path, fake).lanes_pay(32, 64) is pays
    assert fake.calls == [(32, 64)]
    line = "lanes: 64 clients as lanes (lanes measured 1.40x faster" if pays else \
        "lanes: 64 clients one after another (lanes measured 1.25x slower"
    assert line in caplog.text and "saved to" in caplog.text and str(tmp_path) in caplog.text


def test_the_answer_is_cached_per_model_batch_and_lane_count(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    first = Fake(2.0)
    assert policy(tmp_path, first).lanes_pay(32, 64)
    again = Fake(0.5)  # a new run on the same machine: the cached answer, no measurement
    with caplog.at_level("WARNING"):
        assert policy(tmp_path, again).lanes_pay(32, 70) and again.calls == []  # 70 lanes: measured at 64
    assert "cached in" in caplog.text
    assert not policy(tmp_path, again).lanes_pay(16, 64)  # another batch size: measured
    assert not policy(tmp_path, again).lanes_pay(32, 32)  # another lane count: measured
    other = {**MODEL, "shapes": [["w", [100, 4], "torch.float32"]]}
    assert not policy(tmp_path, again, model=other).lanes_pay(32, 64)  # another model shape: measured
    assert again.calls == [(16, 64), (32, 32), (32, 64)]
    p = policy(tmp_path, Fake(2.0))
    p.lanes_pay(32, 64)
    assert p.decided == {(32, 64): True}  # and once per run


def test_run_batched_min_lanes_overrides_without_measuring(tmp_path: Path) -> None:
    fake = Fake(0.1)
    forced = policy(tmp_path, fake, chosen=1)
    assert forced.lanes_pay(32, 1) and forced.lanes_pay(32, 64)
    assert not policy(tmp_path, fake, chosen=100).lanes_pay(32, 64)
    assert not policy(tmp_path, fake).lanes_pay(32, CPU_MIN_LANES - 1)  # too few to measure
    assert fake.calls == [] and list(tmp_path.iterdir()) == []


def test_a_failed_calibration_trains_one_after_another(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken(batch_size: int, lanes: int) -> Measured:
        raise RuntimeError("no")

    with caplog.at_level("WARNING"):
        assert not LanePolicy(None, CPU, MODEL, broken, folder=tmp_path).lanes_pay(32, 16)
    assert "calibration of lanes failed: RuntimeError: no" in caplog.text


def test_bucket() -> None:
    assert [bucket(n) for n in (1, 2, 3, 8, 63, 64, 100)] == [2, 2, 2, 8, 32, 64, 64]


def test_the_runtime_measures_its_own_model_and_follows_the_answer(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The real calibration of a tiny model (positive times, every state and the RNG left alone), cached under
    $FEDHET_CACHE/lanes; a 'lanes slower' answer gives the in-process numbers bit for bit."""
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "CALIBRATION_S", 0.05)
    exp = build_experiment(load_config(None, AUTO))
    rt = BatchedClients(exp)
    rng = torch.get_rng_state()
    measured = calibration.measure(rt, 8, 8)
    assert measured.lanes == 8 and measured.lane_step_s > 0 and measured.seq_step_s > 0
    assert torch.equal(torch.get_rng_state(), rng)
    alg = exp.algorithm
    msgs = {cid: alg.broadcast(alg.init_server(), exp.round_info(1), cid) for cid in range(10)}
    slow = Measured(8, lane_step_s=1.0, seq_step_s=0.01)
    monkeypatch.setattr(rt.policy, "measure", lambda b, n: slow)
    laned: list[int] = []
    chunk = rt._fit_chunk
    monkeypatch.setattr(rt, "_fit_chunk", lambda rnd, jobs, rows=None: (laned.extend(j.cid for j in jobs),
                                                                         chunk(rnd, jobs, rows))[1])
    got, want = rt.fit(1, msgs), InProcessClients(exp).fit(1, msgs)
    assert laned == [] and len(list((tmp_path / "lanes").iterdir())) == 1
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(a.message.arrays[k], v) for k, v in b.message.arrays.items())
    fast = dataclasses.replace(slow, seq_step_s=1.0)
    monkeypatch.setattr(rt, "policy", LanePolicy(None, CPU, {"other": 1}, lambda b, n: fast, folder=tmp_path))
    rt.fit(1, msgs)
    assert sorted(laned) == list(range(10))
