"""privacy.dp on Flower (issue 41 item 4): fedhet's ServerApp takes the server's DP step (clip the shared keys,
noise the mean, adaptive clip, the accountant, max_epsilon) in the same code as in-process, and fedhet's ClientApp
noises its own update under mode=local with the in-process seeds: the same epsilon and the same metrics rows, bit
for bit (as test_flower.py without DP). Real ClientApp objects on an in-process grid (flower_testing.AppGrid) in
the default suite, and Flower's simulation engine (Ray) here with -m slow and, under local DP across a stop and a
resume, in the default suite's one Ray test (test_flower_faults.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from fedhet_testing import metric_rows

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
pytest.importorskip("flwr")
pytest.importorskip("dp_accounting")

from flower_testing import AppGrid  # noqa: E402
from flwr.clientapp.mod import fixedclipping_mod  # noqa: E402
from flwr.serverapp.exception import PrivacyBudgetExhausted  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from fedhet.config import load_config  # noqa: E402
from fedhet.core.dp import LOCAL  # noqa: E402
from fedhet.core.dp_accountant import epsilon  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.engine.safe_load import load_trusted  # noqa: E402
from fedhet.launch.run import run_experiment  # noqa: E402
from fedhet.runtimes.flower.app import FlowerSettings, make_client_app  # noqa: E402
from fedhet.runtimes.flower.faults import RoundFailed  # noqa: E402
from fedhet.runtimes.flower.round_loop import FlowerRoundLoop  # noqa: E402
from fedhet.runtimes.flower.strategy import FedhetStrategy, fedhet_client_app  # noqa: E402

pytestmark = pytest.mark.usefixtures("private_flower_home", "task_identity")

BASE = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=1",
        "train.batch_size=16", "train.lr=0.1", "data.max_test_per_client=20", "run.quiet=true", "run.device=cpu",
        "run.num_threads=1", "rounds=2", "server.fraction_fit=0.5"]
# 4 clients, 2 per round (q = 0.5), sigma 1, delta 0.01: epsilon 1.91 after 1 round, 2.74 after 2, 3.40 after 3
DP = ["privacy.dp.noise_multiplier=1.0", "privacy.dp.delta=0.01", "privacy.dp.clip=0.5"]


def cfg(*extra: str):
    return load_config(None, [*BASE, *DP, *extra])


def flower_run(c, run_dir: Path, grid: AppGrid | None = None, resume: bool = False, stop_after: int | None = None):
    """fedhet's ServerApp loop over fedhet's real ClientApp on 4 in-process nodes."""
    grid = grid or AppGrid([make_client_app(FlowerSettings(config=c.to_dict()))] * 4)
    loop = FlowerRoundLoop(build_experiment(c), run_dir, grid, progress=False)  # type: ignore[arg-type]
    if resume:
        loop.resume()
    return loop.run(stop_after=stop_after), grid


def privacy_rows(run_dir: Path) -> list[dict]:
    return [r for r in metric_rows(run_dir) if r["split"] == "privacy"]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("method,extra", [
    ("fedbn", ["privacy.dp.mode=server", "privacy.dp.adaptive.enabled=true", "privacy.dp.adaptive.count_noise_std=1"]),
    ("ditto", ["privacy.dp.mode=local"])])
def test_dp_on_fedhets_server_equals_inprocess(tmp_path, method, extra) -> None:
    """Server noise with adaptive clipping (FedBN: BN stays on the nodes) and local noise taken on the nodes
    (Ditto: the personal model stays there): every metrics row, epsilon included, bit for bit."""
    c = cfg(f"method={method}", *extra)
    run_experiment(c, tmp_path / "inprocess", progress=False)
    flower_run(c, tmp_path / "flower")
    assert metric_rows(tmp_path / "flower") == metric_rows(tmp_path / "inprocess")
    q = 1.0 if "local" in extra[0] else 0.5
    assert [r["epsilon"] for r in privacy_rows(tmp_path / "flower")] == [epsilon(q, 1.0, t, 0.01) for t in (1, 2)]
    assert summary(tmp_path / "flower")["privacy"] == summary(tmp_path / "inprocess")["privacy"]
    server = load_trusted(tmp_path / "flower" / "checkpoints" / "latest.pt", "checkpoint")["server"]
    assert server.opt["dp/steps"] == 2


def test_local_noise_is_taken_on_the_node(tmp_path) -> None:
    """Under mode=local the update leaves the node clipped and noised (marked); a node whose ClientApp does not
    noise (here: its mark stripped) is rejected, never noised for it by the server."""
    c = cfg("method=fedavg", "privacy.dp.mode=local")
    inner = make_client_app(FlowerSettings(config=c.to_dict()))
    sent: list = []

    def app(msg, context):
        """fedhet's ClientApp, whose train replies lose their mark from round 2 on."""
        reply = inner(msg, context)
        if msg.metadata.message_type == "train":
            sent.append(reply.content)
            if len(sent) > 2:
                metrics = reply.content["metrics"]
                reply.content["metrics"] = type(metrics)({k: v for k, v in metrics.items() if k != LOCAL})
        return reply

    with pytest.raises(RoundFailed, match="did not clip and noise its update"):
        flower_run(c, tmp_path / "flower", AppGrid([app] * 4))
    assert sent[0]["metrics"][LOCAL] == 1
    assert load_trusted(tmp_path / "flower" / "checkpoints" / "latest.pt", "checkpoint")["round"] == 1


def test_budget_stops_the_flower_run_before_the_round_and_resume_keeps_epsilon(tmp_path) -> None:
    """max_epsilon 3.0: round 3 (epsilon 3.40) is refused before any node is asked to train; a run stopped after
    round 1 and resumed gives the same rows, epsilon and summary."""
    c = cfg("method=fedavg", "rounds=4", "privacy.dp.mode=server", "privacy.dp.max_epsilon=3.0")
    result, grid = flower_run(c, tmp_path / "straight")
    assert result.rounds_completed == 2
    assert sum(kind == "train" for _, kind in grid.sent) == 4  # 2 rounds of 2 clients, none for round 3
    privacy = summary(tmp_path / "straight")["privacy"]
    assert "round 3 would spend epsilon 3.4" in privacy["stopped"]
    assert privacy["epsilon"] == epsilon(0.5, 1.0, 2, 0.01)

    _, grid = flower_run(c, tmp_path / "split", stop_after=1)
    assert not (tmp_path / "split" / "summary.json").exists()
    flower_run(c, tmp_path / "split", grid, resume=True)
    assert metric_rows(tmp_path / "split") == metric_rows(tmp_path / "straight")
    assert summary(tmp_path / "split")["privacy"] == privacy


def test_fedhet_strategy_under_dp_equals_inprocess(tmp_path) -> None:
    """FedhetStrategy in Flower's own Strategy.start: the in-process global model and epsilon rows, bit for bit;
    the round past max_epsilon raises Flower's PrivacyBudgetExhausted before it is sent, as Flower's DP
    strategies do."""
    c = cfg("method=fedavg", "privacy.dp.mode=server")
    run_experiment(c, tmp_path / "inprocess", progress=False)
    strategy = FedhetStrategy(c)
    grid = AppGrid([fedhet_client_app(config=c)] * 4)
    result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=2)
    server = load_trusted(tmp_path / "inprocess" / "checkpoints" / "latest.pt", "checkpoint")["server"]
    got = result.arrays.to_torch_state_dict()
    assert all(torch.equal(got[k], v) for k, v in server.model.items())
    assert [r for r in strategy.metrics if r["split"] == "privacy"] == privacy_rows(tmp_path / "inprocess")

    limited = FedhetStrategy(cfg("method=fedavg", "privacy.dp.mode=server", "privacy.dp.max_epsilon=3.0"))
    grid = AppGrid([fedhet_client_app(config=c)] * 4)
    with pytest.raises(PrivacyBudgetExhausted, match="round 3 would spend"):
        limited.start(grid=grid, initial_arrays=limited.initial_arrays(), num_rounds=3)
    assert sum(kind == "train" for _, kind in grid.sent) == 4


def test_flowers_dp_wrapper_around_fedhet_strategy_reaches_the_clients() -> None:
    """Flower's own DifferentialPrivacyServerSideFixedClipping around FedhetStrategy (FedAvg): the noised model
    the wrapper returns is the one FedhetStrategy broadcasts and evaluates next (Flower's DP, not fedhet's:
    the whole vector clipped, NumPy's noise, no epsilon rows)."""
    c = cfg("method=fedavg")
    inner = FedhetStrategy(c)
    wrapped = DifferentialPrivacyServerSideFixedClipping(inner, 1.0, 0.5, 2)
    result = wrapped.start(grid=AppGrid([fedhet_client_app(config=c)] * 4), initial_arrays=inner.initial_arrays(),
                           num_rounds=2)
    got = result.arrays.to_torch_state_dict()
    assert all(torch.equal(got[k], v) for k, v in inner.server.model.items())
    plain = FedhetStrategy(c)
    plain.start(grid=AppGrid([fedhet_client_app(config=c)] * 4), initial_arrays=plain.initial_arrays(), num_rounds=2)
    assert not all(torch.equal(got[k], v) for k, v in plain.server.model.items())
    assert not [r for r in inner.metrics if r["split"] == "privacy"]


def test_flowers_client_side_clipping_mod_on_fedhets_client_app() -> None:
    """Flower's DifferentialPrivacyClientSideFixedClipping around FedhetStrategy (FedAvg) with `fixedclipping_mod`
    on fedhet's ClientApp: the clip norm travels in fedhet's request, each update's floating arrays leave the node
    clipped (Flower's DP, not fedhet's: its norm counts BatchNorm's integer num_batches_tracked too, which
    escape the scaling as 0-d arrays), and the noise reaches the clients."""
    c = cfg("method=fedavg")
    norms: list[float] = []

    def measure(msg, context, call_next):
        """The L2 norm of the floating arrays that leave the node minus those that came in (after
        fixedclipping_mod, the inner mod)."""
        reply = call_next(msg, context)
        sent, back = msg.content["arrays"].to_torch_state_dict(), reply.content["arrays"].to_torch_state_dict()
        norms.append(sum(float((back[k].double() - sent[k].double()).pow(2).sum()) for k in sent
                         if sent[k].is_floating_point()) ** 0.5)
        return reply

    inner = FedhetStrategy(c)
    wrapped = DifferentialPrivacyClientSideFixedClipping(inner, 1.0, 0.05, 2)
    app = fedhet_client_app(config=c, train_mods=[measure, fixedclipping_mod])
    result = wrapped.start(grid=AppGrid([app] * 4), initial_arrays=inner.initial_arrays(), num_rounds=2)
    assert len(norms) == 4 and all(n <= 0.05 * (1 + 1e-5) for n in norms), norms
    got = result.arrays.to_torch_state_dict()
    assert all(torch.equal(got[k], v) for k, v in inner.server.model.items())


@pytest.mark.slow
def test_on_flowers_simulation_engine(tmp_path) -> None:
    """Flower's simulation engine (Ray), server noise, max_epsilon 3.0 of 3 rounds: round 3 refused, the
    in-process rows, epsilon and summary. Slow (a Ray start-up, ~75 s on 2 busy cores): the default suite runs
    local DP on Ray, across a stop and a resume, in
    test_flower_faults.py::test_simulation_stop_and_resume_matches_inprocess."""
    from fedhet.runtimes.flower.simulation import run_flower_simulation

    c = cfg("method=fedavg", "rounds=3", "privacy.dp.mode=server", "privacy.dp.max_epsilon=3.0")
    run_experiment(c, tmp_path / "inprocess", progress=False)
    result = run_flower_simulation(c, tmp_path / "sim", num_cpus=2)
    assert result.rounds_completed == 2
    assert metric_rows(tmp_path / "sim") == metric_rows(tmp_path / "inprocess")
    assert len(privacy_rows(tmp_path / "sim")) == 2
    assert summary(tmp_path / "sim")["privacy"] == summary(tmp_path / "inprocess")["privacy"]
