"""Robust aggregation (`server.aggregation`, core/robust.py): each rule by hand on small vectors, equal to Flower's
implementation where Flower has one, personalization-aware (FedBN's BatchNorm never reaches the rule), and the
bad inputs it refuses."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fedhet_testing import tiny_model
from flwr.server.strategy import aggregate as flower

from fedhet.algorithms.fedbn import FedBN
from fedhet.algorithms.fraug import FRAug
from fedhet.algorithms.scaffold import Scaffold
from fedhet.config import ServerConfig, TrainConfig, load_config
from fedhet.config.sections import ROBUST_RULES
from fedhet.core import robust
from fedhet.core.contract import RoundInfo
from fedhet.core.messages import Message, Reply
from fedhet.core.robust import aggregate_shared
from fedhet.errors import ConfigError
from fedhet.launch.run import run_experiment

CPU = torch.device("cpu")


def clients(*points: tuple[float, ...]) -> list[dict[str, torch.Tensor]]:
    """One state per client: its point as the one key `w`."""
    return [{"w": torch.tensor(p, dtype=torch.float32)} for p in points]


def rule(states: list[dict[str, torch.Tensor]], origin: tuple[float, ...] | None = None,
         counts: list[int] | None = None, **server: object) -> list[float]:
    """The rule's new `w` for these clients, from the global model `origin` (default 0)."""
    dim = states[0]["w"].numel()
    current = {"w": torch.tensor(origin or (0.0,) * dim)}
    out = aggregate_shared(states, counts or [1] * len(states), current, ServerConfig(**server))
    return [round(float(v), 6) for v in out["w"]]


def test_every_rule_is_implemented() -> None:
    assert set(robust.RULES) == set(ROBUST_RULES)


def test_median_by_hand() -> None:
    pts = clients((1, 10), (2, 20), (3, -30), (100, 40), (4, 50))
    assert rule(pts, counts=[1, 1, 1, 100, 1], aggregation="median") == [3.0, 20.0]  # sample counts ignored
    even = clients((1, 0), (2, 0), (7, 0), (100, 0))
    assert rule(even, aggregation="median") == [4.5, 0.0]  # numpy's: the mean of the two middle values


def test_trimmed_mean_cuts_both_ends() -> None:
    pts = clients((-50, 1), (1, 1), (2, 1), (3, 1), (100, 1))
    assert rule(pts, aggregation="trimmed_mean", trim=0.2) == [2.0, 1.0]  # int(0.2 * 5) = 1 cut each end
    assert rule(pts, aggregation="trimmed_mean", trim=0.1) == [11.2, 1.0]  # int(0.5) = 0: the plain mean
    seven = clients((-9,), (0,), (1,), (2,), (3,), (4,), (90,))
    assert rule(seven, aggregation="trimmed_mean", trim=0.3) == [2.0]  # 2 cut each end: mean(1, 2, 3)


def test_a_trim_that_cuts_nothing_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    robust.warn_weak_trim.cache_clear()
    pts = clients((0,), (1,), (2,), (30,))
    assert rule(pts, aggregation="trimmed_mean", trim=0.2) == [8.25]  # int(0.8) = 0: the mean
    assert "the trimmed mean of these 4 clients is the plain mean" in caplog.text
    caplog.clear()
    assert rule(pts, aggregation="trimmed_mean", trim=0.25) == [1.5]  # one cut from each end: no warning
    assert rule(pts, aggregation="trimmed_mean", trim=0.25, byzantine=1) == [1.5]
    assert not caplog.text


# squared distances: a-b 1, a-c 4, a-d 18, b-c 5, b-d 13, c-d 10, d-e 98, c-e 164, b-e 181, a-e 200; with f = 1 each
# score sums the n - f - 2 = 2 nearest: a 1+4=5, b 1+5=6, c 4+5=9, d 10+13=23, e 98+164=262
KRUM = clients((0, 0), (1, 0), (0, 2), (3, 3), (10, 10))


def test_krum_picks_the_lowest_score() -> None:
    assert rule(KRUM, origin=(5.0, 5.0), aggregation="krum", byzantine=1) == [0.0, 0.0]  # a, as its own state


def test_multi_krum_averages_the_m_lowest_scores() -> None:
    counts = [10, 10, 20, 10, 10]
    # m = 3: a, b, c weighted 10, 10, 20 -> x = 10/40, y = 2 * 20/40
    assert rule(KRUM, counts=counts, aggregation="multi_krum", byzantine=1, krum_select=3) == [0.25, 1.0]
    # default m = n - f = 4: a, b, c, d -> x = (10 + 30)/50, y = (40 + 30)/50
    assert rule(KRUM, counts=counts, aggregation="multi_krum", byzantine=1) == [0.8, 1.4]


def test_norm_bound_clips_updates_around_the_global_model() -> None:
    pts = clients((4, 5), (1, 2), (1, 1))  # updates from (1, 1): (3, 4) of norm 5, (0, 1), (0, 0)
    # M = 2: (3, 4) -> (1.2, 1.6); the mean update (0.4, 2.6/3) is added to (1, 1)
    assert rule(pts, origin=(1.0, 1.0), aggregation="norm_bound", norm_bound=2.0) == [1.4, round(1 + 2.6 / 3, 6)]
    assert rule(pts, origin=(1.0, 1.0), aggregation="norm_bound", norm_bound=10.0) == [2.0, round(1 + 5 / 3, 6)]


def test_geometric_median_one_weiszfeld_step_by_hand() -> None:
    pts = clients((0, 0), (3, 0), (0, 4))  # updates from the origin; start v0 = their mean (1, 4/3)
    d = [np.hypot(1, 4 / 3), np.hypot(2, 4 / 3), np.hypot(1, 8 / 3)]  # ||v0 - d_i||
    beta = [1 / x for x in d]
    expected = [3 * beta[1] / sum(beta), 4 * beta[2] / sum(beta)]
    assert rule(pts, aggregation="geometric_median", rfa_iterations=1) == [round(x, 6) for x in expected]


def test_geometric_median_resists_an_outlier() -> None:
    pts = clients((0, 1), (1, 0), (0, -1), (-1, 0), (1000, 1000))  # the median of the first four is the origin
    out = rule(pts, aggregation="geometric_median", rfa_iterations=50)
    assert max(abs(x) for x in out) < 0.5  # the mean is (200, 200)


def random_clients(n: int, seed: int = 0) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
    g = torch.Generator().manual_seed(seed)
    states = [{"w": torch.randn(3, 2, generator=g), "b": torch.randn(4, generator=g)} for _ in range(n)]
    return states, [int(x) for x in torch.randint(1, 50, (n,), generator=g)]


FLOWER = [  # (our server settings, Flower's function on [(ndarrays, num_examples)])
    ({"aggregation": "median"}, flower.aggregate_median),
    ({"aggregation": "trimmed_mean", "trim": 0.2}, lambda r: flower.aggregate_trimmed_avg(r, 0.2)),
    ({"aggregation": "trimmed_mean", "trim": 0.3}, lambda r: flower.aggregate_trimmed_avg(r, 0.3)),
    ({"aggregation": "krum", "byzantine": 2}, lambda r: flower.aggregate_krum(r, 2, 0)),
    ({"aggregation": "multi_krum", "byzantine": 1, "krum_select": 3}, lambda r: flower.aggregate_krum(r, 1, 3)),
    ({"aggregation": "norm_bound", "norm_bound": 1e9}, flower.aggregate),  # a bound never reached: FedAvg
]


@pytest.mark.parametrize("n", [7, 8])
@pytest.mark.parametrize(("server", "theirs"), FLOWER)
def test_equal_to_flower(n: int, server: dict[str, object], theirs) -> None:  # noqa: ANN001 - a Flower function
    states, counts = random_clients(n, seed=n)
    current = {k: torch.zeros_like(v) for k, v in states[0].items()}
    ours = aggregate_shared(states, counts, current, ServerConfig(**server))
    expected = theirs([([s["w"].numpy(), s["b"].numpy()], c) for s, c in zip(states, counts, strict=True)])
    for key, want in zip(["w", "b"], expected, strict=True):
        np.testing.assert_allclose(ours[key].numpy(), want, rtol=1e-6, atol=1e-6)


def test_integer_counters_take_the_weighted_mean() -> None:
    states = [{"w": torch.tensor([float(i)]), "n": torch.tensor(i, dtype=torch.long)} for i in (1, 2, 9)]
    out = aggregate_shared(states, [1, 1, 2], {"w": torch.zeros(1), "n": torch.tensor(0)},
                           ServerConfig(aggregation="median"))
    assert out["n"].dtype == torch.long and int(out["n"]) == 5 and float(out["w"]) == 2.0  # (1 + 2 + 18) / 4


def test_fedbn_median_never_sees_batchnorm(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[str]] = []

    def spy(states, current, keys, alpha, cfg):  # noqa: ANN001, ANN202 - the rule's signature
        seen.append(set(keys) | set(states[0]))
        return median(states, current, keys, alpha, cfg)

    median = robust.RULES["median"]
    monkeypatch.setitem(robust.RULES, "median", spy)
    torch.manual_seed(0)
    alg = FedBN(FedBN.Params(), lambda: tiny_model(bn=True), TrainConfig(), ServerConfig(aggregation="median"), 2, CPU)
    server = alg.init_server()
    replies = [Reply(i, Message(arrays={k: v + i for k, v in server.model.items()}), 5) for i in range(3)]
    new = alg.aggregate(server, replies, RoundInfo(round=1, rounds=1, num_clients=3, seed=0))
    bn = {k for k in alg.parts.init_state if k.startswith("features.1.")}
    assert bn and seen and not (seen[0] & bn) and "head.weight" in seen[0]
    assert torch.equal(new.model["head.weight"], server.model["head.weight"] + 1)  # the median of +0, +1, +2


def test_methods_with_their_own_aggregation_refuse() -> None:
    with pytest.raises(ConfigError, match=r"method 'scaffold'.*median.*weighted or uniform"):
        Scaffold(Scaffold.Params(), lambda: tiny_model(), TrainConfig(), ServerConfig(aggregation="median"), 2, CPU)
    with pytest.raises(ConfigError, match="method_args.aggregation=server"):
        FRAug(FRAug.Params(), lambda: tiny_model(bn=True), TrainConfig(), ServerConfig(aggregation="krum"), 2, CPU)


@pytest.mark.parametrize(("server", "message"), [
    ({"trim": 0.5}, r"server.trim .* \[0, 0.5\), got 0.5"),
    ({"trim": -0.1}, r"server.trim"),
    ({"aggregation": "medain"}, "did you mean 'median'"),
    ({"aggregation": "norm_bound"}, "needs server.norm_bound"),
    ({"byzantine": -1}, "server.byzantine"),
])
def test_bad_settings_are_config_errors(server: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerConfig(**server).validate()


def test_too_few_clients_for_krum_or_a_majority() -> None:
    with pytest.raises(ConfigError, match=r"n >= 2f \+ 3.*n=4 with f=1"):
        rule(clients((0,), (1,), (2,), (3,)), aggregation="krum", byzantine=1)
    with pytest.raises(ConfigError, match=r"2 attackers of n=4 .*not a minority.*median"):
        rule(clients((0,), (1,), (2,), (3,)), aggregation="median", byzantine=2)
    rule(clients((0,), (1,), (2,), (3,)), aggregation="norm_bound", norm_bound=1.0, byzantine=2)  # no majority needed


def test_a_run_refuses_krum_before_training(tmp_path) -> None:  # noqa: ANN001 - pytest's tmp_path
    cfg = load_config(None, ["method=fedavg", "rounds=1", "server.aggregation=krum", "server.byzantine=1",
                             "data.max_train_per_client=8", "data.max_test_per_client=8", "run.quiet=true"])
    with pytest.raises(ConfigError, match="n=4 with f=1") as refused:  # offline_digits: 4 clients
        run_experiment(cfg, tmp_path / "krum")
    assert any(entry.name == "sample_round" for entry in refused.traceback)  # before any client trains


def test_fedbn_runs_with_the_geometric_median(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    calls: list[int] = []
    rfa = robust.RULES["geometric_median"]
    monkeypatch.setitem(robust.RULES, "geometric_median", lambda *args: calls.append(1) or rfa(*args))
    cfg = load_config(None, ["method=fedbn", "rounds=2", "server.aggregation=geometric_median", "run.quiet=true",
                             "data.max_train_per_client=32", "data.max_test_per_client=16"])
    result = run_experiment(cfg, tmp_path / "rfa")
    assert len(calls) == 2 and 0.0 <= result.final["avg"]["accuracy"] <= 1.0  # the rule aggregated both rounds


def test_the_page_lists_each_method_where_it_belongs() -> None:
    from fedhet.algorithms import ALGORITHMS
    from fedhet.algorithms.base import Algorithm

    page = (Path(__file__).resolve().parents[2] / "docs" / "robust.md").read_text()
    take, refuse = page.split("## Which methods")[1].split("## Checks")[0].split("\n\n")[1:3]
    listed = {name: re.findall(r"`([a-z_0-9]+)`", text) for name, text in (("take", take), ("refuse", refuse))}
    builtin = {m: ALGORITHMS.get(m) for m in ALGORITHMS.names()
               if ALGORITHMS.get(m).__module__.startswith("fedhet.algorithms.")}  # not the tests' plug-ins
    shared = {m for m, cls in builtin.items() if cls.aggregate is Algorithm.aggregate or cls.shared_aggregation}
    assert set(listed["take"]) - {"weighted", "uniform"} == shared
    assert set(listed["refuse"]) - {"weighted", "uniform", "aggregate"} == set(builtin) - shared
