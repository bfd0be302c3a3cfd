"""Checks on what clients send back: a reply the server cannot trust is rejected with a reason, never aggregated.

A fit reply must carry exactly the arrays the server expects (names, shapes, dtypes), finite floating-point
values, the client id it was sent to and a non-negative example count. What the server expects is derived
from the round's broadcast message:

each method declares it with `Algorithm.reply_layout(broadcast) -> {name: (shape, dtype)}` (by default the
arrays it received; SCAFFOLD: `dy/<key>` and `dc/<key>`); `tests/runtimes/test_flower_faults.py` checks that
every registered method's replies match its own declaration.

An evaluate reply must carry finite-or-NaN numbers for every metric the run directory records, or the
"skipped" marker of a client without that split.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from flwr.app import RecordDict

from fedhet.algorithms import Algorithm
from fedhet.algorithms.base import ArraySpec
from fedhet.core.messages import Message, Reply
from fedhet.engine.rundir import METRIC_KEYS
from fedhet.runtimes.flower.records import META, from_content, metrics_from_content

Spec = dict[str, ArraySpec]


class ReplyRejected(Exception):
    """A client's reply does not match what the server expects; the message says why."""


def expected_reply_spec(alg: Algorithm[Any, Any, Any], broadcast: Message) -> Spec:
    """The arrays a fit reply to `broadcast` must carry, as the method declares them."""
    return dict(alg.reply_layout(broadcast))


def _names(names: set[str], limit: int = 4) -> str:
    shown = sorted(names)[:limit]
    return ", ".join(repr(n) for n in shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_arrays(arrays: dict[str, torch.Tensor], spec: Spec) -> None:
    """Raise ReplyRejected unless `arrays` has exactly the names, shapes and dtypes of `spec`, all finite."""
    missing, extra = set(spec) - set(arrays), set(arrays) - set(spec)
    if missing or extra:
        parts = ([f"missing {_names(missing)}"] if missing else []) + ([f"unexpected {_names(extra)}"] if extra else [])
        raise ReplyRejected(f"wrong array names: {'; '.join(parts)}")
    for name, (shape, dtype) in spec.items():
        value = arrays[name]
        if value.dtype != dtype:
            raise ReplyRejected(f"array {name!r} has dtype {value.dtype}, expected {dtype}")
        if tuple(value.shape) != shape:
            raise ReplyRejected(f"array {name!r} has shape {tuple(value.shape)}, expected {shape}")
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise ReplyRejected(f"array {name!r} holds {bad} NaN/inf value(s)")


def _meta_int(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReplyRejected(f"'{META}.{key}' is {value!r}, expected an integer")
    return value


def fit_reply(content: RecordDict, client: int, spec: Spec) -> Reply:
    """The fedhet Reply in a fit reply's content, or ReplyRejected naming what is wrong with it."""
    try:
        msg, meta = from_content(content)
    except Exception as err:  # noqa: BLE001 - any decoding failure means a malformed reply
        raise ReplyRejected(f"unreadable reply ({type(err).__name__}: {err})") from err
    if _meta_int(meta, "client") != client:
        raise ReplyRejected(f"reply claims to come from client {meta['client']}")
    num_examples = _meta_int(meta, "num-examples")
    if num_examples < 0:
        raise ReplyRejected(f"negative example count {num_examples}")
    check_arrays(msg.arrays, spec)
    return Reply(client, msg, num_examples)


def evaluate_reply(content: RecordDict) -> dict[str, float] | None:
    """An evaluate reply's metrics (None: the client has no such split), or ReplyRejected."""
    meta = content.config_records.get(META)
    if meta is not None and meta.get("skipped") is True:
        return None
    metrics = metrics_from_content(content)
    if metrics is None:
        raise ReplyRejected("evaluate reply without metrics")
    missing = set(METRIC_KEYS) - set(metrics)
    if missing:
        raise ReplyRejected(f"evaluate reply lacks metric(s) {_names(missing)}")
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReplyRejected(f"metric {key!r} is {value!r}, expected a number")
        if math.isinf(value):
            raise ReplyRejected(f"metric {key!r} is {value}")
    return {k: float(v) for k, v in metrics.items()}
