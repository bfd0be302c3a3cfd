"""Checks on what clients send back: a reply the server cannot trust is rejected with a reason, never aggregated.

A fit reply must carry exactly the arrays the server expects (names, shapes, dtypes), finite floating-point
values, the client id it was sent to and a non-negative example count. What the server expects is derived
from the round's broadcast message:

- by default, the reply carries the arrays it received (true for every registered method but SCAFFOLD:
  FedAvg, FedBN, Ditto, FedProto, FRAug, ...; `tests/runtimes/test_flower_faults.py` checks every method);
- SCAFFOLD replies `dy/<key>` for each model key and `dc/<key>` for each control variate `c/<key>`;
- a method may define `reply_spec(broadcast: Message) -> dict[name, (shape, dtype)]` to state its own layout.

An evaluate reply must carry finite-or-NaN numbers for every metric the run directory records, or the
"skipped" marker of a client without that split.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from flwr.app import RecordDict

from fedhet.algorithms import Algorithm
from fedhet.engine.messages import Message, Reply
from fedhet.engine.rundir import METRIC_KEYS
from fedhet.runtimes.flower.records import META, from_content, metrics_from_content

ArraySpec = tuple[tuple[int, ...], torch.dtype]
Spec = dict[str, ArraySpec]


class ReplyRejected(Exception):
    """A client's reply does not match what the server expects; the message says why."""


def spec_of(arrays: dict[str, torch.Tensor]) -> Spec:
    """Names -> (shape, dtype) of a set of arrays."""
    return {k: (tuple(v.shape), v.dtype) for k, v in arrays.items()}


def _scaffold_spec(broadcast: Message) -> Spec:
    from fedhet.algorithms.scaffold import DC, DY, C

    spec = spec_of(broadcast.arrays)
    return {**{DY + k: s for k, s in spec.items() if not k.startswith(C)},
            **{DC + k[len(C):]: s for k, s in spec.items() if k.startswith(C)}}


REPLY_SPECS: dict[str, Callable[[Message], Spec]] = {"scaffold": _scaffold_spec}


def expected_reply_spec(alg: Algorithm, broadcast: Message) -> Spec:
    """The arrays a fit reply to `broadcast` must carry: the method's own `reply_spec` if it has one, a known
    layout (SCAFFOLD), else the broadcast's own arrays."""
    hook = getattr(alg, "reply_spec", None)
    if callable(hook):
        return dict(hook(broadcast))
    if alg.name in REPLY_SPECS:
        return REPLY_SPECS[alg.name](broadcast)
    return spec_of(broadcast.arrays)


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
