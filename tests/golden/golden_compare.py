"""Compare a golden case's new fingerprint with its recording: bit for bit, or within its tier's tolerance.

Exact mode (the machine fingerprint equals the recording's and the case declares no `tolerance_reason`): every
metric field `==` and every tensor's sha256 equal. Tolerance mode (another torch, numpy, Python, CPU capability or
architecture, or a case with `tolerance_reason`): the case's tier (`TIERS`) bounds
- losses, relatively;
- accuracies and balanced accuracies, absolutely;
- each float tensor of the global model: |norm - norm'| and |sum - sum'| / sqrt(numel), relative to the norm of
  the whole global model (a bias near zero has no meaningful relative error of its own);
and keeps exact: round, client, split, num_examples, the global model's keys, dtypes, shapes, integer tensors.

Across machines the `batchnorm` tier is a smoke check only (same ballpark); the check that holds on any x86 machine
is the float64 tier (golden_f64.py: the `float64` tolerance, on every machine). The tiers come from measurement
(docs/golden.md): every case was re-run with an operation-order change (two
torch threads instead of one; float32 instead of float64 accumulation in the server average). Without BatchNorm
the worst change was 5.2e-8 relative in a loss and 3.1e-9 of the model norm in a tensor; with BatchNorm (batch
statistics over 16 and 6 images; why it amplifies rounding this much was not investigated) up to 1.1e-1 in a loss
and 10 of 64 test predictions. So the `well_conditioned` tier is tight (it still catches a
dropped optimizer-state restore or FedProx's mu 0.01 -> 0.1, not mu 0.01 -> 0.02) and the `batchnorm` tier only
checks the same ballpark; the bit-for-bit mode is the real check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    """The tolerance-mode bounds of one tier."""

    loss_rel: float
    acc_abs: float
    tensor_rel: float  # relative to the global model's norm

    def describe(self, tier: str) -> str:
        return (f"tier {tier}: losses rel {self.loss_rel:g}, accuracies abs {self.acc_abs:g}, global tensors "
                f"{self.tensor_rel:g} of the model norm; identities, shapes, integer tensors exact")


TIERS = {"well_conditioned": Tolerance(loss_rel=1e-6, acc_abs=1e-6, tensor_rel=1e-7),
         "batchnorm": Tolerance(loss_rel=0.25, acc_abs=0.25, tensor_rel=0.05),  # a smoke check, no more
         # golden_f64.py's cases, on every machine: float64 moved <= 1.1e-12 / 0 / 1.7e-14 across CPU kernels
         "float64": Tolerance(loss_rel=1e-9, acc_abs=0.0, tensor_rel=1e-9)}
FLOAT_FIELDS = ("loss", "accuracy", "balanced_accuracy")


def mode_of(recorded_machine: dict[str, str], machine: dict[str, str], tolerance_reason: str | None,
            tier: str, verified: list[dict[str, str]] | tuple[()] = ()) -> tuple[bool, str]:
    """(exact?, a sentence naming the mode and why) for this machine and case; `verified`: other machines on which
    every case of the recording was re-run and found bit for bit (golden.json's `verified_exact_on`)."""
    if tolerance_reason:
        return False, f"tolerance mode (the case declares: {tolerance_reason}; {TIERS[tier].describe(tier)})"
    if machine in verified:
        return True, "exact mode (this machine reproduced the whole recording bit for bit: verified_exact_on)"
    keys = sorted(set(recorded_machine) | set(machine))
    changed = [f"{k} {recorded_machine.get(k)} -> {machine.get(k)}" for k in keys
               if recorded_machine.get(k) != machine.get(k)]
    if not changed:
        return True, "exact mode (the machine fingerprint matches the recording: bit for bit)"
    smoke = "; a smoke check only: the float64 tier (golden_f64.py) is what holds here" if tier == "batchnorm" else ""
    return False, f"tolerance mode (machine differs from the recording: {', '.join(changed)}; " \
                  f"{TIERS[tier].describe(tier)}{smoke})"


def _field_ok(field: str, old: Any, new: Any, tol: Tolerance | None) -> bool:
    if tol is None or field not in FLOAT_FIELDS or not all(isinstance(v, (int, float)) for v in (old, new)):
        return bool(old == new)
    if math.isnan(old) or math.isnan(new):
        return math.isnan(old) and math.isnan(new)
    if field == "loss":
        return math.isclose(old, new, rel_tol=tol.loss_rel, abs_tol=1e-12)
    return abs(old - new) <= tol.acc_abs


def compare_metrics(old: list[dict[str, Any]], new: list[dict[str, Any]], tol: Tolerance | None) -> str | None:
    """The first differing metric row and field, or None."""
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        for field in a:
            if field not in b or not _field_ok(field, a[field], b.get(field), tol):
                where = f"round {a.get('round')}, client {a.get('client')}, split {a.get('split')}"
                return f"metrics row {i} ({where}) field {field!r}: recorded {a[field]!r}, now {b.get(field)!r}"
    if len(old) != len(new):
        return f"metrics.jsonl has {len(new)} rows, recorded {len(old)}"
    return None


def _is_float(digest: dict[str, Any]) -> bool:
    return any(t in digest["dtype"] for t in ("float", "complex"))


def _tensor_problem(a: dict[str, Any], b: dict[str, Any], tol: Tolerance | None, scale: float) -> str | None:
    for field in ("dtype", "shape"):
        if a[field] != b[field]:
            return f"{field}: recorded {a[field]}, now {b[field]}"
    if tol is None or not _is_float(a):
        return None if a["sha256"] == b["sha256"] else (
            f"sha256 {a['sha256'][:16]}.. != {b['sha256'][:16]}.. (sum recorded {a['sum']!r}, now {b['sum']!r}; "
            f"norm recorded {a['norm']!r}, now {b['norm']!r})")
    bound = tol.tensor_rel * scale + 1e-12
    if abs(a["norm"] - b["norm"]) > bound:
        return f"norm: recorded {a['norm']!r}, now {b['norm']!r} (bound {bound:.3g})"
    if abs(a["sum"] - b["sum"]) > bound * math.sqrt(math.prod(a["shape"])):
        return f"sum: recorded {a['sum']!r}, now {b['sum']!r} (bound {bound:.3g} * sqrt(numel))"
    return None


def compare_global(old: dict[str, Any] | None, new: dict[str, Any] | None, tol: Tolerance | None) -> str | None:
    """The first differing tensor of the global model (by key), or None."""
    if old is None or new is None:
        return None if old is new else \
            f"global model: recorded {'none' if old is None else 'one'}, now {'none' if new is None else 'one'}"
    if set(old) != set(new):
        return f"global model keys differ: missing {sorted(set(old) - set(new))}, new {sorted(set(new) - set(old))}"
    scale = math.sqrt(sum(d["norm"] ** 2 for d in old.values() if _is_float(d)))
    for key in old:
        problem = _tensor_problem(old[key], new[key], tol, scale)
        if problem:
            return f"global tensor {key!r}: {problem}"
    return None


def compare(name: str, recorded: dict[str, Any], new: dict[str, Any], tol: Tolerance | None, mode: str
            ) -> str | None:
    """None if `new` reproduces `recorded` (bit for bit if `tol` is None); else one message naming the case,
    the mode and the first difference."""
    problem = compare_metrics(recorded["metrics"], new["metrics"], tol) or \
        compare_global(recorded["global"], new["global"], tol)
    return None if problem is None else f"golden case {name!r}, {mode}: {problem}"
