"""The float64 tier of the golden runs (issue 39 item 6): numbers that hold on any x86 machine, not only the
recording one.

A float32 golden case is exact only on the CPU it was recorded on: another CPU (another SIMD width, another
oneDNN/MKL kernel) rounds differently in the last bit, and the BatchNorm cases amplify that to 10% of a loss. The
same cases in float64 (every parameter, buffer and activation; the CNN casts its uint8-derived float32 input as its
first layer), with deterministic kernels and one thread, move by at most 1.1e-12 relative in a loss and 1.7e-14 of
the model norm in a weight when the kernels change (AVX512 -> AVX2 -> no SIMD, measured: docs/golden.md), and
not at all in an accuracy. Their tier (`golden_compare.TIERS["float64"]`, 1e-9) keeps three orders of magnitude
of margin above that and far below what a real change moves (docs/golden.md lists the broken variants it caught).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from golden.golden_cases import CASES_BY_NAME, GoldenCase
from torch import nn

from fedhet.data.offline_digits import DOMAINS, load_offline_digits_domain
from fedhet.data.registry import LoadContext
from fedhet.models import MODELS, SplitModel
from fedhet.models.small_cnn import small_cnn

MODEL = "golden_small_cnn_float64"
# one case per method recorded in golden.json, plus the engine parts the methods share: the persisted optimizer,
# the server optimizer, the batched runtime, the CNN without BatchNorm
NAMES = ("fedavg", "fedprox", "fedbn", "ditto", "ditto_mmd", "fraug", "scaffold", "moon", "fedproto", "fedbabu",
         "fedrep", "pfedavg", "partialfed_adaptive", "single", "all", "embnoise", "fedavg_persist_optimizer",
         "fedadam", "batched_fedavg", "batched_ditto", "fedavg_no_bn")


class Float64Input(nn.Module):
    """The CNN's first layer: the loader's float32 images to float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float64)


@functools.wraps(small_cnn)  # the same arguments (`model.args={width: 8}`), read from its signature
def small_cnn_float64(num_classes: int, input_shape: tuple[int, ...], pretrained: bool = False,
                      **args: Any) -> SplitModel:
    """`small_cnn` in float64: built under the float64 default dtype, its input cast by its first layer."""
    model = small_cnn(num_classes, input_shape, pretrained, **args)
    model.features = nn.Sequential(Float64Input(), *model.features)
    return model.to(torch.float64)


def float64_case(case: GoldenCase) -> GoldenCase:
    """`case` on the float64 CNN (its name kept: golden_f64.json is a file of its own)."""
    return GoldenCase(case.name, (*case.overrides, f"model.name={MODEL}"), case.runtime, case.global_model,
                      tier="float64")


CASES: tuple[GoldenCase, ...] = tuple(float64_case(CASES_BY_NAME[name]) for name in NAMES)


@contextlib.contextmanager
def float64_mode() -> Iterator[None]:
    """The float64 CNN registered, float64 as the default dtype (every tensor a method creates), deterministic
    kernels; all three undone afterwards. The offline_digits images are rendered first, in float32: the same
    pixels whichever test runs first in the process."""
    dtype, deterministic = torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled()
    for domain in DOMAINS:  # the images rendered as every float32 run renders them (cached), not in float64
        load_offline_digits_domain(LoadContext(None, 28), domain)
    MODELS.register(MODEL)(small_cnn_float64)
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_default_dtype(dtype)
        MODELS._items.pop(MODEL, None)
