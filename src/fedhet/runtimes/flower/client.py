"""The ClientApp side: one fedhet client per SuperNode, seeded and run exactly as `InProcessClients` does.

The client id is the node's `partition-id` (Flower's node config; the simulation sets it for every virtual
node). The client's state (FedBN's local BatchNorm, Ditto's personal model, optimizer states, ...) never
leaves the node: it is kept in Flower's `context.state` as torch.save bytes and, when the node config names a
`state-dir`, also written there atomically (`client_<id>.pt`), so it survives a SuperNode restart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, RecordDict
from flwr.app import Message as FlowerMessage

from fedhet.algorithms import ClientState
from fedhet.config import load_config
from fedhet.engine.atomic import atomic_write_bytes
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.seeding import seeded
from fedhet.errors import FedhetError
from fedhet.runtimes.flower.records import (
    from_content,
    metrics_content,
    state_from_bytes,
    state_to_bytes,
    to_content,
)

STATE_KEY = "fedhet-client-state"
_EXPERIMENTS: dict[str, Experiment] = {}  # one per process: a Ray actor or a ClientApp process reuses it


def experiment_for(config: dict[str, Any]) -> Experiment:
    """The Experiment of this config, built once per process (data, model factory, algorithm)."""
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _EXPERIMENTS:
        _EXPERIMENTS.clear()
        _EXPERIMENTS[key] = build_experiment(load_config(base=config))
    return _EXPERIMENTS[key]


def client_id(context: Context, exp: Experiment) -> int:
    """This node's fedhet client id: its `partition-id`, checked against the experiment's clients."""
    node = context.node_config
    if "partition-id" not in node:
        raise FedhetError("the SuperNode has no partition-id; start it with "
                          "--node-config 'partition-id=I num-partitions=K'")
    cid, n = int(node["partition-id"]), len(exp.data.clients)
    if "num-partitions" in node and int(node["num-partitions"]) != n:
        raise FedhetError(f"node config num-partitions={node['num-partitions']} but the experiment has {n} clients")
    if not 0 <= cid < n:
        raise FedhetError(f"partition-id {cid} is out of range for {n} clients")
    return cid


def _state_file(context: Context, cid: int) -> Path | None:
    folder = context.node_config.get("state-dir")
    return Path(str(folder)) / f"client_{cid}.pt" if folder else None


def load_state(context: Context, exp: Experiment, cid: int) -> ClientState:
    """The client's state: from context.state, else from its state-dir file, else the algorithm's initial one."""
    record = context.state.config_records.get(STATE_KEY)
    if record is not None:
        return state_from_bytes(record["state"])  # type: ignore[arg-type]
    path = _state_file(context, cid)
    if path is not None and path.is_file():
        return state_from_bytes(path.read_bytes())
    return exp.algorithm.init_client(cid)


def save_state(context: Context, cid: int, rnd: int, state: ClientState) -> None:
    data = state_to_bytes(state)
    context.state[STATE_KEY] = ConfigRecord({"state": data, "round": rnd, "client": cid})
    path = _state_file(context, cid)
    if path is not None:
        atomic_write_bytes(path, data)


def handle_train(msg: FlowerMessage, context: Context, config: dict[str, Any]) -> FlowerMessage:
    """One client's local training round, seeded by (seed, round, client, 'fit') as in-process."""
    exp = experiment_for(config)
    cid = client_id(context, exp)
    request, meta = from_content(msg.content)
    _check_routing(meta, cid)
    rnd = int(meta["round"])
    state = load_state(context, exp, cid)
    ctx = exp.context(cid, rnd, exp.data.clients[cid])
    with seeded(exp.config.seed, rnd, cid, "fit"):
        out, new_state = exp.algorithm.fit(request, state, ctx)
    save_state(context, cid, rnd, new_state)
    return FlowerMessage(to_content(out, client=cid, **{"num-examples": ctx.data.num_train}), reply_to=msg)


def handle_evaluate(msg: FlowerMessage, context: Context, config: dict[str, Any]) -> FlowerMessage:
    """Metrics of the client's deployed model on its own split, seeded by (seed, round, client, 'evaluate')."""
    exp = experiment_for(config)
    cid = client_id(context, exp)
    request, meta = from_content(msg.content)
    _check_routing(meta, cid)
    rnd, split = int(meta["round"]), str(meta["split"])
    dataset = getattr(exp.data.clients[cid], split)
    if dataset is None:
        return FlowerMessage(metrics_content(None), reply_to=msg)
    state = load_state(context, exp, cid)
    with seeded(exp.config.seed, rnd, cid, "evaluate"):
        metrics = exp.algorithm.evaluate(request, state, exp.context(cid, rnd), dataset)
    return FlowerMessage(metrics_content(metrics), reply_to=msg)


def handle_query(msg: FlowerMessage, context: Context, config: dict[str, Any]) -> FlowerMessage:
    """Who is this node: its client id (the server maps node ids to client ids with it)."""
    exp = experiment_for(config)
    cid = client_id(context, exp)
    return FlowerMessage(RecordDict({"fedhet": ConfigRecord({"client": cid})}), reply_to=msg)


def _check_routing(meta: dict[str, Any], cid: int) -> None:
    if int(meta["client"]) != cid:
        raise FedhetError(f"a message for client {meta['client']} reached the node of client {cid}")
