"""The premise of docs/flower.md "FedBN (local BatchNorm) under a stock FedAvg server": Flower's own FedAvg driving
fedhet's FedBN ClientApp ends with global arrays that hold no BatchNorm array, so a strict load of them fails and
the page's non-strict load is what works."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from flower_testing import AppGrid  # noqa: E402
from flwr.app import ArrayRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.runtimes.flower.strategy import fedhet_client_app  # noqa: E402


def test_stock_fedavg_with_fedbn_clients_leaves_no_batchnorm(monkeypatch) -> None:
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # as inside a ServerApp process
        monkeypatch.setattr(TaskIdentity, name, value)
    cfg = load_config("configs/quickstart.yaml", ["method=fedbn", "rounds=1", "train.local_steps=1"])
    exp = build_experiment(cfg)
    model = exp.algorithm.server_model(exp.init_server())
    shared = exp.algorithm.shared_keys(model)
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=4, min_available_nodes=4)
    initial = ArrayRecord({k: v for k, v in model.state_dict().items() if k in shared})  # what FedBN broadcasts
    result = strategy.start(grid=AppGrid([fedhet_client_app(config=cfg)] * 4), initial_arrays=initial, num_rounds=1)
    assert result.train_metrics_clientapp  # the round was aggregated
    assert set(result.arrays) == shared and shared < set(model.state_dict())
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict(result.arrays.to_torch_state_dict())
    missing, unexpected = model.load_state_dict(result.arrays.to_torch_state_dict(), strict=False)
    assert missing and not unexpected and set(missing) <= set(model.state_dict()) - shared
