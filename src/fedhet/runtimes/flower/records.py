"""fedhet messages <-> Flower's message conventions (the flwr >= 1.20 Message API), 1:1 and loss-free.

fedhet speaks what Flower's own strategies (`flwr.serverapp.strategy.FedAvg`, ...) and quickstart ClientApps
speak, so either side can be a stock Flower app:

request (server -> client)
    "arrays"  ArrayRecord   the broadcast's arrays (names, dtypes and shapes kept)
    "config"  ConfigRecord  the broadcast's scalars (int / float / str / bool keep their types), "server-round",
                            fedhet's bookkeeping: "split" (evaluate), "state-round", "keep-rounds" (see client),
                            and in train requests "lr" / "local-epochs" for stock Flower ClientApps
fit reply (client -> server)
    "arrays"  ArrayRecord   the reply's arrays
    "metrics" MetricRecord  "num-examples" and the reply's numeric scalars (train_loss, steps, ...)
    "config"  ConfigRecord  the reply's str / bool scalars, only when it has some (Flower's strategies ignore it)
evaluate reply
    "metrics" MetricRecord  "num-examples" and the metrics ("accuracy", "balanced_accuracy", "loss"); a client
                            without the requested split answers zeros with num-examples 0 and "config" {"skipped"}

Which client a message is for is not in the message: a node serves the client of its `partition-id`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    ConfigRecordValues,
    MessageType,
    MetricRecord,
    MetricRecordValues,
    RecordDict,
)

from fedhet.core.contract import ClientState
from fedhet.core.messages import Message, Scalar
from fedhet.errors import FedhetError

ARRAYS, CONFIG, METRICS = "arrays", "config", "metrics"
SERVER_ROUND, NUM_EXAMPLES = "server-round", "num-examples"
SPLIT, STATE_ROUND, KEEP_ROUNDS, SKIPPED = "split", "state-round", "keep-rounds", "skipped"
PARTITION_ID = "partition-id"  # Flower's node config key for the client a node holds; the query reply's
QUERY_ACTION = "partition_id"  # a query action only fedhet's ClientApp registers
QUERY_PARTITION = f"{MessageType.QUERY}.{QUERY_ACTION}"
DATA_SCHEMA = "fedhet-data-schema"  # a node-data query reply: its data's names and shapes (local_data.py)
LR, LOCAL_EPOCHS = "lr", "local-epochs"  # the train config Flower's quickstart ClientApps read (fedhet's ignore it)
RUN_FOLDER = "run-folder"  # the server's run folder (per-run-dir runs): client state folders are kept per run
REQUEST_KEYS = (SERVER_ROUND, SPLIT, STATE_ROUND, KEEP_ROUNDS, LR, LOCAL_EPOCHS, RUN_FOLDER)  # reserved in "config"


@dataclass(frozen=True)
class Request:
    """A train / evaluate request as the client reads it. `state_round` is None when the server does not keep
    fedhet's state bookkeeping (a stock Flower strategy): the client then continues from its latest state."""

    message: Message
    round: int
    split: str | None = None
    state_round: int | None = None
    keep_rounds: tuple[int, ...] = field(default=())
    run_folder: str = ""  # per-run-dir: the server's run folder name ('' = the run dir itself)


def request_content(msg: Message, rnd: int, **bookkeeping: ConfigRecordValues) -> RecordDict:
    """A fedhet broadcast as a Flower request: arrays, and the scalars with the round (and `bookkeeping`) in config."""
    clash = sorted(set(msg.scalars) & set(REQUEST_KEYS))
    if clash:
        raise ValueError(f"message scalar(s) {clash} use names reserved for Flower's request config")
    config = ConfigRecord({**msg.scalars, SERVER_ROUND: rnd, **bookkeeping})
    return RecordDict({ARRAYS: _arrays(msg), CONFIG: config})


def read_request(content: RecordDict) -> Request:
    """The fedhet Message and bookkeeping of a request (from fedhet's server or a stock Flower strategy)."""
    config = dict(_single(content.config_records, CONFIG) or {})
    if SERVER_ROUND not in config:
        raise ValueError(f"the request has no '{SERVER_ROUND}' in its ConfigRecord '{CONFIG}'")
    split, state_round = config.pop(SPLIT, None), config.pop(STATE_ROUND, None)
    run_folder = str(config.pop(RUN_FOLDER, ""))
    for hint in (LR, LOCAL_EPOCHS):  # a fedhet client trains as its experiment config says
        config.pop(hint, None)
    keep, rnd = config.pop(KEEP_ROUNDS, []), int(config.pop(SERVER_ROUND))
    message = Message(_tensors(content), _scalars(config))
    return Request(message, rnd, None if split is None else str(split),
                   None if state_round is None else int(state_round),
                   tuple(int(r) for r in keep), run_folder)


def fit_reply_content(msg: Message, num_examples: int) -> RecordDict:
    """A fit reply: arrays, and `num-examples` with the numeric scalars as metrics (str / bool ones in config)."""
    numeric = {k: v for k, v in msg.scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if NUM_EXAMPLES in numeric:
        raise ValueError(f"a reply scalar may not be named '{NUM_EXAMPLES}' (Flower's sample-count key)")
    content = RecordDict({ARRAYS: _arrays(msg), METRICS: MetricRecord({**numeric, NUM_EXAMPLES: num_examples})})
    other: dict[str, ConfigRecordValues] = {k: v for k, v in msg.scalars.items() if k not in numeric}
    if other:
        content[CONFIG] = ConfigRecord(other)
    return content


def read_fit_reply(content: RecordDict) -> tuple[Message, Any]:  # Any: num-examples as sent, unchecked
    """The reply's Message (metrics and config as scalars) and its `num-examples` (unchecked: see validation)."""
    metrics = dict(_single(content.metric_records, METRICS) or {})
    num_examples = metrics.pop(NUM_EXAMPLES, None)
    numeric = {k: v for k, v in metrics.items() if not isinstance(v, list)}  # a list metric has no fedhet scalar
    scalars = {**_scalars(numeric), **_scalars(dict(_single(content.config_records, CONFIG) or {}))}
    return Message(_tensors(content), scalars), num_examples


def evaluate_reply_content(metrics: dict[str, float] | None) -> RecordDict:
    """An evaluate reply; None (the client has no such split): zeros with num-examples 0 and a 'skipped' marker."""
    if metrics is None:
        return RecordDict({METRICS: MetricRecord({"accuracy": 0.0, "balanced_accuracy": 0.0, "loss": 0.0,
                                                  NUM_EXAMPLES: 0}),
                           CONFIG: ConfigRecord({SKIPPED: True})})
    values: dict[str, MetricRecordValues] = {(NUM_EXAMPLES if k == "num_examples" else k): v
                                             for k, v in metrics.items()}
    return RecordDict({METRICS: MetricRecord(values)})


def read_evaluate_reply(content: RecordDict) -> dict[str, Any] | None:  # Any: Flower record values, unchecked
    """An evaluate reply's metrics as sent (None: the client has no such split); validation checks them."""
    config = _single(content.config_records, CONFIG)
    if config is not None and config.get(SKIPPED) is True:
        return None
    record = _single(content.metric_records, METRICS)
    return None if record is None else dict(record)


def _single(records: Any, name: str) -> Any:  # Any: any of Flower's *Record mappings
    """The record called `name`, else the only record of that kind (Flower apps may name theirs), else None."""
    if name in records:
        return records[name]
    return next(iter(records.values())) if len(records) == 1 else None


def _arrays(msg: Message) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu() for k, v in msg.arrays.items()})


def _tensors(content: RecordDict) -> dict[str, torch.Tensor]:
    arrays = _single(content.array_records, ARRAYS)
    return dict(arrays.to_torch_state_dict()) if arrays is not None and len(arrays) else {}


def _scalars(values: dict[str, Any]) -> dict[str, Scalar]:  # Any: Flower record values, checked here
    """Message.scalars from record values; a value that is not a number, string or bool is a ValueError (records
    also hold bytes and lists, which no fedhet Message sends)."""
    for key, value in values.items():
        if not isinstance(value, (int, float, str)):  # bool is an int
            raise ValueError(f"scalar {key!r} is {value!r}, expected a number, string or bool")
    return dict(values)


def state_to_bytes(state: ClientState) -> bytes:
    """A client state (any nesting of tensors, numbers, optimizer states, dataclasses) as torch.save bytes."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> ClientState:
    """The client state `state_to_bytes` was given."""
    from fedhet.engine.safe_load import load_trusted  # tensors, numbers and fedhet states only: no code runs

    state = load_trusted(data, "a client state (Flower context.state / state folder)")
    if not isinstance(state, ClientState):  # what torch.load returns is untyped: check it is what was saved
        raise FedhetError(f"a stored client state holds a {type(state).__name__}, not a client state")
    return state
