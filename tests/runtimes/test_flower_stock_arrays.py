"""fedhet's ClientApp under a stock Flower server: arrays that are not the method's broadcast (missing, unknown,
another shape) are one error naming them, before anything trains."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402

from fedhet.config import load_config  # noqa: E402
from fedhet.core.messages import Message  # noqa: E402
from fedhet.errors import FedhetError  # noqa: E402
from fedhet.runtimes.flower import client  # noqa: E402
from fedhet.runtimes.flower.app import FlowerSettings  # noqa: E402
from fedhet.runtimes.flower.records import request_content  # noqa: E402


@pytest.fixture(scope="module")
def setup() -> tuple[Context, dict[str, torch.Tensor]]:
    cfg = load_config(None, ["data.dataset=offline_digits", "model.name=small_cnn", "model.args={width: 8}",
                             "method=fedbn", "train.local_steps=1", "run.num_threads=1"])
    run_config = FlowerSettings(config=cfg.to_dict()).to_run_config()
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config=run_config,
                      node_config={"partition-id": 0, "num-partitions": 4})
    exp = client.experiment_for(FlowerSettings.from_run_config(dict(run_config)).config)
    arrays = exp.algorithm.broadcast(exp.init_server(), exp.round_info(1), 0).arrays
    return context, {k: v.clone() for k, v in arrays.items()}


def _train(context: Context, arrays: dict[str, torch.Tensor]) -> RecordDict:
    content = request_content(Message(arrays), 1)  # no fedhet bookkeeping: what a stock strategy sends
    return client.train_content(content, context, FlowerSettings.from_run_config(dict(context.run_config))
                                .client_setup())


def test_the_methods_own_arrays_train(setup) -> None:
    context, arrays = setup
    assert "arrays" in _train(context, arrays)


def test_missing_unknown_and_misshapen_arrays_are_named(setup) -> None:
    context, arrays = setup
    first, second = sorted(arrays)[:2]
    with pytest.raises(FedhetError, match=f"missing {first}"):
        _train(context, {k: v for k, v in arrays.items() if k != first})
    with pytest.raises(FedhetError, match="unknown fc9.weight"):
        _train(context, {**arrays, "fc9.weight": torch.zeros(2)})
    with pytest.raises(FedhetError, match=f"shape of {second}: \\(1,\\), expected"):
        _train(context, {**arrays, second: torch.zeros(1)})
