"""fedhet and stock Flower apps drive each other (issue 15 item 2), through real ClientApp / Strategy objects on
an in-process grid (flower_grid.AppGrid): (a) Flower's own FedAvg strategy drives fedhet's ClientApp; (b)
fedhet's ServerApp loop drives a quickstart-style PyTorch ClientApp; (c) every fedhet method as a Flower
Strategy + ClientApp gives the in-process runtime's global model."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest
import torch
from fedhet_testing import for_method, metric_rows

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
pytest.importorskip("flwr")

from flower_testing import AppGrid  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from fedhet.algorithms import ALGORITHMS  # noqa: E402
from fedhet.config import load_config  # noqa: E402
from fedhet.data import build_federated_data  # noqa: E402
from fedhet.engine.evaluation import evaluate  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.engine.safe_load import load_trusted  # noqa: E402
from fedhet.launch.run import run_experiment  # noqa: E402
from fedhet.runtimes.flower.app import FlowerSettings, make_client_app  # noqa: E402
from fedhet.runtimes.flower.round_loop import FlowerRoundLoop  # noqa: E402
from fedhet.runtimes.flower.strategy import FedhetStrategy, fedhet_client_app  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_identity")

# 4 clients (one domain each), enough local work for the model to learn within 3 rounds
LEARNS = ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}", "train.local_steps=20",
          "train.lr=0.1", "rounds=3", "eval.every=1", "run.num_threads=1", "run.quiet=true",
          "server.aggregation=weighted"]


def cfg(*extra: str):
    return load_config(overrides=[*LEARNS, *extra])


def final_server_model(run_dir: Path) -> dict[str, torch.Tensor]:
    exp = build_experiment(load_config(run_dir / "config.yaml"))
    server = load_trusted(run_dir / "checkpoints" / "latest.pt", "checkpoint")["server"]
    return exp.algorithm.server_model(server).state_dict()


def pooled_accuracy(c, arrays: dict[str, torch.Tensor]) -> float:
    exp = build_experiment(c)
    model = exp.algorithm.server_model(exp.algorithm.init_server())
    model.load_state_dict(arrays)
    return evaluate(model, exp.data.pooled_test(), torch.device("cpu"))["accuracy"]


def start(strategy, c, apps, rounds: int, **kwargs):
    """Flower's own Strategy.start on the in-process grid; the global model as tensors."""
    exp = build_experiment(c)
    initial = ArrayRecord(exp.algorithm.server_model(exp.algorithm.init_server()).state_dict())
    result = strategy.start(grid=AppGrid(apps), initial_arrays=initial, num_rounds=rounds, **kwargs)
    return result, result.arrays.to_torch_state_dict()


# FedProx in the default suite (it also carries the proximal term) for round 1, which is the exact check; FedAvg
# and the 3-round learning comparison with -m slow (about 30 s each on 2 cores)
@pytest.mark.parametrize(("method", "learning"), [pytest.param("fedavg", True, marks=pytest.mark.slow),
                                                  ("fedprox", False),
                                                  pytest.param("fedprox", True, marks=pytest.mark.slow)])
def test_stock_fedavg_strategy_drives_fedhets_client_app(method: str, learning: bool) -> None:
    """flwr.serverapp.strategy.FedAvg (weighted by num-examples, every node every round) with fedhet's ClientApp:
    round 1 gives fedhet's own global model (up to float summation order: numpy, and FedAvg's random node
    order), and after 3 rounds the model has learned about as much as fedhet's. Later rounds amplify the 1e-7
    differences (this small BN network turns 1e-7 into ~1e-4 in one client's 20 steps), so the trajectories part
    and only the accuracy is compared; Python's `random` (FedAvg's node sampling) is seeded so the test is
    deterministic."""
    random.seed(0)
    c = cfg(f"method={method}")
    stock = FedAvg(min_train_nodes=4, min_evaluate_nodes=4, min_available_nodes=4)
    apps = [make_client_app(FlowerSettings(config=c.to_dict()))] * 4
    _, got = start(stock, c, apps, 1, train_config=ConfigRecord({"lr": 0.5}))  # a fedhet client keeps its own lr
    strategy = FedhetStrategy(c)
    _, expected = start(strategy, c, [fedhet_client_app(config=c)] * 4, 1)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.allclose(got[key].to(value.dtype), value, atol=1e-5), key
    if not learning:
        return
    result, got = start(stock, c, apps, 3)
    _, expected = start(FedhetStrategy(c), c, [fedhet_client_app(config=c)] * 4, 3)
    accuracy, reference = pooled_accuracy(c, got), pooled_accuracy(c, expected)
    assert accuracy > 0.3 and reference > 0.3 and abs(accuracy - reference) < 0.2  # chance: 0.1
    assert "train_loss" in result.train_metrics_clientapp[3]
    assert result.evaluate_metrics_clientapp[3]["accuracy"] > 0.25


def quickstart_client_app(c) -> ClientApp:
    """A ClientApp as Flower's PyTorch quickstart template writes it: its own training loop on its partition,
    `lr` and `local-epochs` from the train config, replies {"arrays", "metrics": train_loss, num-examples} and
    {"metrics": eval_loss, eval_acc, num-examples}. Only the model class and the data are fedhet's."""
    app = ClientApp()
    exp = build_experiment(c)
    data = build_federated_data(c.data, c.seed)

    def net(msg: Message) -> torch.nn.Module:
        model = exp.algorithm.server_model(exp.algorithm.init_server())
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return model

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        part = data.clients[int(context.node_config["partition-id"])]
        model, lr = net(msg), float(msg.content["config"]["lr"])
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
        loader = torch.utils.data.DataLoader(part.train, batch_size=32, shuffle=True)
        model.train()
        for _ in range(int(msg.content["config"]["local-epochs"])):
            for x, y in loader:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
        metrics = {"train_loss": float(loss), "num-examples": len(part.train)}
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate_fn(msg: Message, context: Context) -> Message:
        part = data.clients[int(context.node_config["partition-id"])]
        result = evaluate(net(msg), part.test, torch.device("cpu"))
        metrics = {"eval_loss": result["loss"], "eval_acc": result["accuracy"], "num-examples": len(part.test)}
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


@pytest.mark.parametrize("partition_query", [True, False])
def test_fedhets_server_drives_a_quickstart_client_app(tmp_path, partition_query) -> None:
    """fedhet's ServerApp loop (run directory, metrics rows) with stock ClientApps: the partition query they do
    not answer (or none, run config `partition-query = false`) gives them client ids in node order, `lr` is
    read from the train config, num-examples from their MetricRecord, eval_acc / eval_loss as accuracy / loss."""
    torch.manual_seed(0)  # the stock loop shuffles with torch's global generator, as the template does
    rounds = 2 if partition_query else 1  # without the query: only the mapping differs, one round shows it
    c = cfg("method=fedavg", "train.local_steps=null", "train.local_epochs=3", f"rounds={rounds}")
    grid = AppGrid([quickstart_client_app(c)] * 4)
    loop = FlowerRoundLoop(build_experiment(c), tmp_path / "run", grid, progress=False,
                           partition_query=partition_query)
    result = loop.run()
    assert result.rounds_completed == rounds
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    avg = [r for r in metrics if r["client"] == "avg" and r["split"] == "test"]
    assert [r["round"] for r in avg] == list(range(1, rounds + 1)) and avg[-1]["num_examples"] > 0
    assert avg[-1]["accuracy"] > (0.2 if rounds == 2 else 0.0)  # learned in 2 rounds; chance is 0.1
    assert all(r["balanced_accuracy"] is None for r in metrics if r["client"] != "avg")  # NaN, written as null
    assert sum(kind.startswith("query") for _, kind in grid.sent) == (4 if partition_query else 0)  # once, at start


FEDERATED = sorted(m for m in ALGORITHMS.names() if not ALGORITHMS.get(m).centralized)


@pytest.mark.parametrize("method", FEDERATED)
def test_every_method_is_a_flower_strategy(tmp_path, method) -> None:
    """FedhetStrategy + fedhet_client_app under Flower's own Strategy.start: the in-process global model, bit for
    bit, and the same evaluation rows; half the clients sampled per round, so sampling is exercised too."""
    c = load_config(overrides=for_method(method, [*LEARNS, "server.fraction_fit=0.5", "rounds=2",
                                                  "train.local_steps=2"]))
    run_experiment(c, tmp_path / "inprocess", progress=False)
    expected = final_server_model(tmp_path / "inprocess")
    strategy = FedhetStrategy(c)
    grid = AppGrid([fedhet_client_app(config=c)] * 4)
    result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=c.rounds)
    got = result.arrays.to_torch_state_dict()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    rows = metric_rows(tmp_path / "inprocess")
    test_rows = [r for r in rows if r["split"] == "test"]
    assert strategy.metrics == test_rows
    assert result.evaluate_metrics_clientapp[c.rounds]["accuracy"] == test_rows[-1]["accuracy"]
    assert sum(kind == "train" for _, kind in grid.sent) == 2 * c.rounds  # 2 of 4 clients each round (one-shot: 1)


def test_flower_md_strategy_example_runs(tmp_path, monkeypatch) -> None:
    """The example in docs/flower.md ("Drop a fedhet method into your own Flower app") as a user would paste
    it: its ServerApp main and ClientApp, run here on the in-process grid."""
    text = (Path(__file__).parents[2] / "docs" / "flower.md").read_text()
    code = re.search(r"<!-- example: strategy -->\n```python\n(.*?)```", text, re.S)
    assert code is not None, "docs/flower.md lost its strategy example"
    assert len([line for line in code.group(1).splitlines() if line.strip()]) <= 15  # "a 15-line example"
    monkeypatch.chdir(Path(__file__).parents[2])
    namespace: dict = {}
    exec(compile(code.group(1), "docs/flower.md", "exec"), namespace)  # noqa: S102 - our own docs
    grid = AppGrid([namespace["client_app"]] * 4)
    namespace["server_app"](grid, Context(run_id=1, node_id=0, state=RecordDict(),
                                          run_config={"num-server-rounds": 2}, node_config={}))
    assert sum(kind == "train" for _, kind in grid.sent) == 8  # 4 clients, 2 rounds


@pytest.mark.slow
def test_on_flowers_simulation_engine_both_ways(tmp_path) -> None:
    """The same two pairings on Flower's real runtime (simulation engine, Ray): a stock FedAvg ServerApp with
    fedhet's ClientApp, and fedhet's ServerApp with the quickstart-style ClientApp."""
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedhet.runtimes.flower.app import make_server_app
    from fedhet.runtimes.flower.simulation import backend_config

    c = cfg("method=fedprox")
    exp = build_experiment(c)
    initial = ArrayRecord(exp.algorithm.server_model(exp.algorithm.init_server()).state_dict())
    results = []
    stock_server = ServerApp()

    @stock_server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(min_train_nodes=4, min_evaluate_nodes=4, min_available_nodes=4)
        results.append(strategy.start(grid=grid, initial_arrays=initial, num_rounds=2))

    run_simulation(stock_server, make_client_app(FlowerSettings(config=c.to_dict())), num_supernodes=4,
                   backend_config=backend_config(2, 1))  # type: ignore[arg-type]
    assert results and results[0].evaluate_metrics_clientapp[2]["accuracy"] > 0.2
    assert len(results[0].train_metrics_clientapp) == 2

    q = cfg("method=fedavg", "train.local_steps=null", "train.local_epochs=8", "rounds=2")
    settings = FlowerSettings(config=q.to_dict(), run_dir=str(tmp_path / "run"), wait_for_nodes=60.0)
    run_simulation(make_server_app(settings), quickstart_client_app(q), num_supernodes=4,
                   backend_config=backend_config(2, 1))  # type: ignore[arg-type]
    assert not settings.errors and settings.results[0].rounds_completed == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if r["client"] == "avg"] == [1, 2]
