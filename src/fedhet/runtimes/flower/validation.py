"""Checks on what clients send back: a reply the server cannot trust is rejected with a reason, never aggregated.

A fit reply must carry exactly the arrays the server expects (names, shapes, dtypes), finite floating-point
values and a non-negative integer `num-examples` (and come from the node the message went to: transport; under
privacy.dp.mode=local, carry the mark of a client that noised its own update). What
the server expects is derived from the round's broadcast message:

each method declares it with `Algorithm.reply_layout(broadcast) -> {name: (shape, dtype)}` (by default the
arrays it received; SCAFFOLD: `dy/<key>` and `dc/<key>`; a dimension of -1 matches any size, e.g. FedBiP's
number of uploaded latents); `tests/runtimes/test_flower_faults.py` checks that
every registered method's replies match its own declaration.

An evaluate reply must carry finite-or-NaN numbers (under fedhet's or a Flower app's usual names, see
METRIC_ALIASES), or the "skipped" marker of a client without that split.
"""

from __future__ import annotations

import math

import torch
from flwr.app import RecordDict

from fedhet.algorithms.base import AnyAlgorithm, ArraySpec
from fedhet.core.dp import LOCAL
from fedhet.core.messages import Message
from fedhet.runtimes.flower.records import CONFIG, NUM_EXAMPLES, SKIPPED, read_evaluate_reply, read_fit_reply

Spec = dict[str, ArraySpec]


class ReplyRejected(Exception):
    """A client's reply does not match what the server expects; the message says why."""


def expected_reply_spec(alg: AnyAlgorithm, broadcast: Message) -> Spec:
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
        sizes = tuple(value.shape)
        if len(sizes) != len(shape) or any(want not in (-1, got) for want, got in zip(shape, sizes, strict=True)):
            raise ReplyRejected(f"array {name!r} has shape {tuple(value.shape)}, expected {shape}")
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise ReplyRejected(f"array {name!r} holds {bad} NaN/inf value(s)")


def fit_reply(content: RecordDict, spec: Spec, local_dp: bool = False) -> tuple[Message, int]:
    """The Message and example count of a fit reply, or ReplyRejected naming what is wrong with it; with
    `local_dp` (privacy.dp.mode=local) a reply whose client did not clip and noise its update is rejected."""
    try:
        msg, num_examples = read_fit_reply(content)
    except Exception as err:  # noqa: BLE001 - any decoding failure means a malformed reply
        raise ReplyRejected(f"unreadable reply ({type(err).__name__}: {err})") from err
    whole = isinstance(num_examples, (int, float)) and not isinstance(num_examples, bool) \
        and float(num_examples).is_integer()
    if not whole:
        raise ReplyRejected(f"'{NUM_EXAMPLES}' in the reply's MetricRecord is {num_examples!r}, expected an integer")
    if num_examples < 0:
        raise ReplyRejected(f"negative example count {num_examples}")
    check_arrays(msg.arrays, spec)
    if local_dp and msg.scalars.get(LOCAL) != 1:
        raise ReplyRejected(f"privacy.dp.mode=local, but the client did not clip and noise its update (no '{LOCAL}' "
                            "in its reply): run fedhet's ClientApp with the server's config")
    return msg, int(num_examples)


# names Flower apps commonly give fedhet's metrics (the quickstart templates: eval_acc, eval_loss)
METRIC_ALIASES = {"accuracy": ("accuracy", "acc", "eval_acc", "eval_accuracy", "test_acc", "test_accuracy"),
                  "balanced_accuracy": ("balanced_accuracy", "eval_balanced_accuracy"),
                  "loss": ("loss", "eval_loss", "test_loss")}


def evaluate_reply(content: RecordDict) -> dict[str, float] | None:
    """An evaluate reply's metrics under fedhet's names (None: the client has no such split), or ReplyRejected.

    A Flower app's own names are accepted (METRIC_ALIASES, e.g. `eval_acc`); a metric it does not report is
    NaN; its other metrics are kept as they are; `num-examples` becomes `num_examples`."""
    metrics = read_evaluate_reply(content)
    if metrics is None:
        config = content.config_records.get(CONFIG)
        if config is not None and config.get(SKIPPED) is True:
            return None
        raise ReplyRejected("evaluate reply without metrics")
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReplyRejected(f"metric {key!r} is {value!r}, expected a number")
        if math.isinf(value):
            raise ReplyRejected(f"metric {key!r} is {value}")
    out = {k: float(v) for k, v in metrics.items() if k != NUM_EXAMPLES}
    for name, aliases in METRIC_ALIASES.items():
        out[name] = next((float(metrics[a]) for a in aliases if a in metrics), math.nan)
    out["num_examples"] = int(metrics.get(NUM_EXAMPLES, 0))
    return out
