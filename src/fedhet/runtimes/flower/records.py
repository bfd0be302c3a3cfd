"""fedhet messages <-> Flower records, 1:1 and loss-free.

A request (server -> client) is a RecordDict with
    "arrays": ArrayRecord (Message.arrays, every dtype and shape kept)
    "scalars": ConfigRecord (Message.scalars; int / float / str / bool keep their types)
    "fedhet": ConfigRecord {"round", "client", "split" (evaluate only), "state-round", "keep-rounds"}
A fit reply adds "fedhet": {"client", "num-examples"}; an evaluate reply carries "metrics": MetricRecord
(or "fedhet": {"skipped": True} when the client has no such split).
"""

from __future__ import annotations

import io
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, ConfigRecordValues, MetricRecord, RecordDict

from fedhet.core.messages import Message, Reply

META = "fedhet"


def to_content(msg: Message, **meta: ConfigRecordValues) -> RecordDict:
    """A fedhet Message (plus routing metadata) as Flower record content."""
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in msg.arrays.items()})
    return RecordDict({"arrays": arrays, "scalars": ConfigRecord(dict(msg.scalars)), META: ConfigRecord(meta)})


def from_content(content: RecordDict) -> tuple[Message, dict[str, Any]]:
    """The fedhet Message and the metadata in Flower record content."""
    arrays = content.array_records.get("arrays")
    tensors = dict(arrays.to_torch_state_dict()) if arrays is not None and len(arrays) else {}
    meta = content.config_records.get(META)
    return Message(tensors, _scalars(content.config_records.get("scalars"))), dict(meta) if meta else {}


def _scalars(record: ConfigRecord | None) -> dict[str, int | float | str | bool]:
    """Message.scalars from its ConfigRecord; a value that is not a number, string or bool is a ValueError (a
    ConfigRecord also holds bytes and lists, which no fedhet Message sends)."""
    out: dict[str, int | float | str | bool] = {}
    for key, value in (record or {}).items():
        if not isinstance(value, (int, float, str)):  # bool is an int
            raise ValueError(f"scalar {key!r} is {value!r}, expected a number, string or bool")
        out[key] = value
    return out


def reply_from_content(content: RecordDict) -> Reply:
    """A fit reply's content as the fedhet Reply the algorithm's `aggregate` expects."""
    msg, meta = from_content(content)
    return Reply(int(meta["client"]), msg, int(meta["num-examples"]))


def metrics_content(metrics: dict[str, float] | None) -> RecordDict:
    """An evaluate reply: the metrics, or a 'skipped' marker when the client has no such split."""
    if metrics is None:
        return RecordDict({META: ConfigRecord({"skipped": True})})
    return RecordDict({"metrics": MetricRecord({k: v for k, v in metrics.items()})})


def metrics_from_content(content: RecordDict) -> dict[str, Any] | None:
    """An evaluate reply's metrics as the client sent them (`validation.evaluate_reply` checks each is a number)."""
    record = content.metric_records.get("metrics")
    return None if record is None else dict(record)


def state_to_bytes(state: object) -> bytes:
    """A client state (any nesting of tensors, numbers, optimizer states, dataclasses) as torch.save bytes."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> Any:
    """The object `state_to_bytes` was given (its type is the caller's: the algorithm's client state)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
