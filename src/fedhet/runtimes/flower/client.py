"""The ClientApp side: one fedhet client per SuperNode, seeded and run exactly as `InProcessClients` does.

The client id is the node's `partition-id` (Flower's node config; the simulation sets it for every virtual
node), or in a node-data run its `client-id`, with its data read from its own `data-root` (local_data.py).
The client's state never leaves the node: kept per round in Flower's `context.state` and, with a state folder
(node config `state-dir`, else the run's `client-state-dir`), in `round_<r>.pt` files; a request's `state-round`
says which round's state to continue from, `keep-rounds` which others to keep (docs/flower.md, "Client state").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from flwr.app import ConfigRecord, Context, RecordDict
from flwr.app import Message as FlowerMessage

from fedhet.algorithms import ClientState
from fedhet.atomic import atomic_write_bytes
from fedhet.config import load_config
from fedhet.core.dp import local_message
from fedhet.core.seeding import EVALUATE, FIT, client_stream, seeded
from fedhet.engine.checkpoint import fingerprint
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.local import evaluate_client, fit_client
from fedhet.errors import FedhetError
from fedhet.runtimes.flower import checkpoint_config, local_data
from fedhet.runtimes.flower.records import (
    CONFIG,
    DATA_SCHEMA,
    PARTITION_ID,
    Request,
    evaluate_reply_content,
    fit_reply_content,
    read_request,
    state_from_bytes,
    state_to_bytes,
)
from fedhet.yaml_input import JSONDict

STATE_KEY = "fedhet-client-state"  # context.state ConfigRecord: "r<round>" -> torch.save bytes of the state
_EXPERIMENTS: dict[str, Experiment] = {}  # one per process: a Ray actor or a ClientApp process reuses it


@dataclass(frozen=True)
class ClientSetup:
    """What a ClientApp needs besides the message: the experiment config, the run dir (a key for state
    folders) and the run-level client state folder ('' = none; a node's own `state-dir` takes precedence)."""

    config: JSONDict
    run_dir: str = ""
    state_dir: str = ""
    node_data: bool = False  # each node loads only its own data from its data-root (local_data.py)


_EXPECTED: dict[int, dict[str, tuple[int, ...]]] = {}  # id(experiment) -> its broadcast's array shapes


def experiment_for(config: JSONDict) -> Experiment:
    """The Experiment of this config, built once per process (data, model factory, algorithm)."""
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _EXPERIMENTS:
        _EXPERIMENTS.clear()
        _EXPERIMENTS[key] = build_experiment(load_config(base=config))
    return _EXPERIMENTS[key]


def check_stock_arrays(exp: Experiment, arrays: JSONDict) -> None:
    """What a stock Flower server sends must be what this method broadcasts: the same array names and shapes
    (fedhet's own server sends them by construction); else one FedhetError naming the arrays, before training."""
    if id(exp) not in _EXPECTED:
        _EXPECTED.clear()
        sample = exp.algorithm.broadcast(exp.init_server(), exp.round_info(1), 0)
        _EXPECTED[id(exp)] = {k: tuple(v.shape) for k, v in sample.arrays.items()}
    expected = _EXPECTED[id(exp)]
    odd = (("missing", sorted(set(expected) - set(arrays))), ("unknown", sorted(set(arrays) - set(expected))))
    problems = [f"{what} {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" for what, names in odd if names]
    shapes = [f"{k}: {tuple(arrays[k].shape)}, expected {expected[k]}" for k in sorted(set(expected) & set(arrays))
              if tuple(arrays[k].shape) != expected[k]]
    if shapes:
        problems.append(f"shape of {shapes[0]}" + (f" (and {len(shapes) - 1} more)" if len(shapes) > 1 else ""))
    if problems:
        raise FedhetError(f"the server's arrays do not fit {exp.config.method} on {exp.config.model.name}: "
                          f"{'; '.join(problems)}. A stock strategy must send the arrays this method broadcasts "
                          "(its initial_arrays from the same model and method: docs/flower.md)")


def client_id(context: Context, exp: Experiment) -> int:
    """This node's fedhet client id: its `partition-id`, checked against the experiment's clients."""
    node = context.node_config
    if PARTITION_ID not in node:
        raise FedhetError("the SuperNode has no partition-id; start it with "
                          "--node-config 'partition-id=I num-partitions=K'")
    cid, n = int(node[PARTITION_ID]), len(exp.data.clients)
    if "num-partitions" in node and int(node["num-partitions"]) != n:
        raise FedhetError(f"node config num-partitions={node['num-partitions']} but the experiment has {n} clients")
    if not 0 <= cid < n:
        raise FedhetError(f"partition-id {cid} is out of range for {n} clients")
    return cid


def experiment_and_id(context: Context, setup: ClientSetup) -> tuple[Experiment, int]:
    """The experiment and this node's client id: in a node-data run from the node's own `data-root` and
    `client-id` (local_data.py), else the whole federated data and the node's partition-id."""
    if setup.node_data:
        return local_data.node_experiment(setup.config, dict(context.node_config))
    if local_data.DATA_ROOT in context.node_config:
        raise FedhetError("this SuperNode has a data-root, but the run builds the whole federated data on every "
                          "node (run config node-data=false): write the App with `fedhet flower app CONFIG "
                          "--node-data` or run it with --run-config \"node-data=true\"")
    exp = experiment_for(setup.config)
    return exp, client_id(context, exp)


def run_key(setup: ClientSetup) -> str:
    """A folder name that tells runs apart in a node's shared state-dir (results-relevant config + run dir)."""
    text = fingerprint(checkpoint_config(setup.config)) + "|" + setup.run_dir
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_folder(context: Context, setup: ClientSetup, cid: int) -> Path | None:
    """Where this client's per-round states are written, if anywhere."""
    node_dir = context.node_config.get("state-dir")
    if node_dir:
        return Path(str(node_dir)) / run_key(setup) / f"client_{cid}"
    if setup.state_dir:
        return Path(setup.state_dir) / f"client_{cid}"
    return None


def _stored(context: Context) -> JSONDict:
    record = context.state.config_records.get(STATE_KEY)
    return dict(record) if record is not None else {}


def _keep(context: Context, rnd: int, data: bytes) -> None:
    """Keep the state bytes of round `rnd` in context.state."""
    context.state[STATE_KEY] = ConfigRecord({**_stored(context), f"r{rnd}": data})


def stored_rounds(context: Context) -> list[int]:
    """The rounds whose states this node keeps in context.state."""
    return sorted(int(k[1:]) for k in _stored(context))


def stored_state(context: Context, rnd: int) -> ClientState | None:
    """The state this node stored after fitting round `rnd` (None if it has none in context.state)."""
    data = _stored(context).get(f"r{rnd}")
    return None if data is None else state_from_bytes(data)


def load_state(context: Context, exp: Experiment, setup: ClientSetup, cid: int, state_round: int) -> ClientState:
    """The client's state after round `state_round`: from context.state, else from its state folder, else
    (round 0) the algorithm's initial state; a clear error when it is gone."""
    stored = stored_state(context, state_round)
    if stored is not None:
        return stored
    if state_round == 0:
        initial: ClientState = exp.algorithm.init_client(cid)  # a method looked up by name: its own state type
        return initial
    folder = state_folder(context, setup, cid)
    path = None if folder is None else folder / f"round_{state_round}.pt"
    if path is not None and path.is_file():
        data = path.read_bytes()
        _keep(context, state_round, data)
        return state_from_bytes(data)
    where = f"nor in {folder}" if folder is not None else "and the node has no state-dir"
    raise FedhetError(f"client {cid} has no state of round {state_round}: not in context.state "
                      f"(rounds {stored_rounds(context)}) {where}. It was lost with a restarted SuperNode "
                      "or a new Flower run; give the SuperNodes a state-dir (node config) to resume")


def save_state(context: Context, setup: ClientSetup, cid: int, rnd: int, state: ClientState) -> None:
    """Store the state after fitting round `rnd` (used once the server aggregates this reply)."""
    data = state_to_bytes(state)
    _keep(context, rnd, data)
    folder = state_folder(context, setup, cid)
    if folder is not None:
        atomic_write_bytes(folder / f"round_{rnd}.pt", data)


def folder_states(folder: Path | None) -> dict[int, Path]:
    """round -> `round_<r>.pt` of the states in a client's state folder (none without a folder)."""
    if folder is None or not folder.is_dir():
        return {}
    return {int(p.stem[6:]): p for p in folder.glob("round_*.pt") if p.stem[6:].isdigit()}


def prune_states(context: Context, setup: ClientSetup, cid: int, rnd: int, keep: set[int]) -> None:
    """Drop stored states of rounds before `rnd` that the server can no longer ask for."""
    stored = _stored(context)
    kept = {k: v for k, v in stored.items() if int(k[1:]) in keep or int(k[1:]) >= rnd}
    if len(kept) != len(stored):
        context.state[STATE_KEY] = ConfigRecord(kept)
    for r, path in folder_states(state_folder(context, setup, cid)).items():
        if r < rnd and r not in keep:
            path.unlink(missing_ok=True)


def latest_state_round(context: Context, setup: ClientSetup, cid: int, before: int) -> int:
    """The last round before `before` whose state this node keeps (0: none): the state a client continues
    from when the server keeps no state bookkeeping (a stock Flower strategy aggregates every reply)."""
    rounds = set(stored_rounds(context)) | set(folder_states(state_folder(context, setup, cid)))
    return max((r for r in rounds if r < before), default=0)


def _request(content: RecordDict, context: Context, setup: ClientSetup, fit: bool
             ) -> tuple[Experiment, int, Request, int, ClientSetup]:
    """Decode a train / evaluate request: experiment, client id (the node's partition-id), the request, the
    round of the state to continue from and the setup of this run (state folders per run folder, if any)."""
    exp, cid = experiment_and_id(context, setup)
    request = read_request(content)
    if request.run_folder:  # per-run-dir: one Flower run's states never mix with another's
        setup = dataclasses.replace(setup, run_dir=str(Path(setup.run_dir) / request.run_folder), state_dir=str(
            Path(setup.state_dir) / request.run_folder) if setup.state_dir else "")
    state_round = request.state_round
    if state_round is None:  # a stock Flower server: continue from the latest state (of an earlier round, to fit)
        check_stock_arrays(exp, request.message.arrays)
        state_round = latest_state_round(context, setup, cid, request.round if fit else request.round + 1)
    prune_states(context, setup, cid, request.round, {state_round, *request.keep_rounds})
    return exp, cid, request, state_round, setup


def train_content(content: RecordDict, context: Context, setup: ClientSetup) -> RecordDict:
    """One client's local training round, seeded by (seed, round, client, 'fit') as in-process: the reply's
    content (the request's content in, `context.state` updated); under privacy.dp.mode=local its update clipped
    and noised here, on the node."""
    exp, cid, request, state_round, setup = _request(content, context, setup, fit=True)
    rnd = request.round
    state = load_state(context, exp, setup, cid, state_round)
    ctx = exp.context(cid, rnd, exp.data.clients[cid])
    with seeded(*client_stream(exp.config.seed, rnd, cid, FIT)):
        out, new_state = fit_client(exp.algorithm, request.message, state, ctx)
    save_state(context, setup, cid, rnd, new_state)
    dp = exp.config.privacy.dp
    if dp.mode == "local":  # the update leaves the node clipped and noised, as in-process (core/dp.py)
        out = local_message(dp, request.message.arrays, out, exp.config.seed, rnd, cid)
    return fit_reply_content(out, ctx.data.num_train)


def evaluate_content(content: RecordDict, context: Context, setup: ClientSetup) -> RecordDict:
    """Metrics of the client's deployed model on its own split (the request's `split`, else 'test'), seeded by
    (seed, round, client, 'evaluate')."""
    exp, cid, request, state_round, setup = _request(content, context, setup, fit=False)
    split = request.split or "test"
    if split not in ("train", "val", "test"):
        raise FedhetError(f"unknown split {split!r} in the evaluate request; expected train, val or test")
    dataset = getattr(exp.data.clients[cid], split)
    if dataset is None:
        return evaluate_reply_content(None)
    state = load_state(context, exp, setup, cid, state_round)
    with seeded(*client_stream(exp.config.seed, request.round, cid, EVALUATE)):
        metrics = evaluate_client(exp.algorithm, request.message, state, exp.context(cid, request.round), dataset)
    return evaluate_reply_content(metrics)


def query_content(content: RecordDict, context: Context, setup: ClientSetup) -> RecordDict:
    """Which client this node holds: the server's one question at start (a stock ClientApp does not answer it;
    the server then gives that node a free client id, see transport.NodeLink)."""
    exp, cid = experiment_and_id(context, setup)
    answer: JSONDict = {PARTITION_ID: cid}
    if setup.node_data:  # what the server needs to build the model, no samples (local_data.py)
        answer[DATA_SCHEMA] = local_data.schema_of(exp.data)
    return RecordDict({CONFIG: ConfigRecord(answer)})


HANDLERS = {"train": train_content, "evaluate": evaluate_content, "query": query_content}


def handle(kind: str, msg: FlowerMessage, context: Context, setup: ClientSetup) -> FlowerMessage:
    """Answer a train / evaluate / query message of the ServerApp (`kind`: Flower's message type, with or
    without its action: "query.partition_id" is a query)."""
    return FlowerMessage(HANDLERS[kind.split(".")[0]](msg.content, context, setup), reply_to=msg)

