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
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedhet.engine.messages import Message, Reply

META = "fedhet"


def to_content(msg: Message, **meta: int | float | str | bool | list[int]) -> RecordDict:
    """A fedhet Message (plus routing metadata) as Flower record content."""
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in msg.arrays.items()})
    return RecordDict({"arrays": arrays, "scalars": ConfigRecord(dict(msg.scalars)), META: ConfigRecord(meta)})


def from_content(content: RecordDict) -> tuple[Message, dict[str, Any]]:
    """The fedhet Message and the metadata in Flower record content."""
    arrays = content.array_records.get("arrays")
    tensors = dict(arrays.to_torch_state_dict()) if arrays is not None and len(arrays) else {}
    scalars = content.config_records.get("scalars")
    meta = content.config_records.get(META)
    return Message(tensors, dict(scalars) if scalars else {}), dict(meta) if meta else {}


def reply_from_content(content: RecordDict) -> Reply:
    """A fit reply's content as the fedhet Reply the algorithm's `aggregate` expects."""
    msg, meta = from_content(content)
    return Reply(int(meta["client"]), msg, int(meta["num-examples"]))


def metrics_content(metrics: dict[str, float] | None) -> RecordDict:
    """An evaluate reply: the metrics, or a 'skipped' marker when the client has no such split."""
    if metrics is None:
        return RecordDict({META: ConfigRecord({"skipped": True})})
    return RecordDict({"metrics": MetricRecord({k: v for k, v in metrics.items()})})


def metrics_from_content(content: RecordDict) -> dict[str, float] | None:
    record = content.metric_records.get("metrics")
    return None if record is None else dict(record)


def state_to_bytes(state: dict[str, Any]) -> bytes:
    """A ClientState (any nesting of tensors, numbers, optimizer states) as torch.save bytes."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def state_from_bytes(data: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
