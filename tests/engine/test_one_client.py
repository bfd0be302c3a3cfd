"""A config whose data gives one client (a one-domain image folder, a one-client CSV) is not trained as a
"federation" without a word."""

from __future__ import annotations

import logging

from fedhet.config import load_config
from fedhet.engine.experiment import build_experiment


def test_a_one_client_federation_is_said(caplog) -> None:
    cfg = load_config(None, ["data.dataset=offline_digits", "data.domains=[clean]", "data.fraction=0.2",
                             "model.args={width: 4}", "run.num_threads=1"])
    with caplog.at_level(logging.WARNING, logger="fedhet.engine.experiment"):
        build_experiment(cfg)
    assert "gives 1 client (clean)" in caplog.text and "data.num_clients=K" in caplog.text
