"""Where lanes pay: which clients the batched runtime trains as lanes and which one after another.

Measured on this project's 2-core CPU (docs/results/runtimes.md "Lanes"): a vmapped step of a few lanes costs more
than a plain step, and clients of more than CPU_PAYS_UP_TO parameters trained no faster as lanes at all. So a
batch-size group of fewer than `run.batched_min_lanes` clients trains one after another with the in-process code,
and by default, on a CPU, so does every group of a model above CPU_PAYS_UP_TO (goal (c) of issue 18: where
vectorizing cannot pay, say so before the run and do not run slower).
"""

from __future__ import annotations

import logging
import sys

import torch

log = logging.getLogger(__name__)
CPU_MIN_LANES = 8  # run.batched_min_lanes' default on a CPU: the paper's FedPop space ran 0.77x in-process with 2
CPU_PAYS_UP_TO = 64_000  # parameters per client: 784-64-10 (51k) trained 1.4x faster as lanes, 2352-32-10 (76k) 0.8x


def min_lanes(chosen: int | None, device: torch.device, params: int) -> int:
    """`run.batched_min_lanes` (`chosen`), or its default: on a CPU CPU_MIN_LANES, and no lanes at all for a model
    of more than CPU_PAYS_UP_TO parameters; 2 on a GPU."""
    if chosen is not None:
        return chosen
    if device.type != "cpu":
        return 2
    return CPU_MIN_LANES if params <= CPU_PAYS_UP_TO else sys.maxsize


def say_if_slower(chosen: int | None, device: torch.device, params: int) -> None:
    """Before the run: a warning where lanes cannot pay (a CPU, a model above CPU_PAYS_UP_TO parameters), saying
    what the runtime does about it."""
    if device.type != "cpu" or params <= CPU_PAYS_UP_TO:
        return
    log.warning("run.runtime=batched: a client model of %d parameters on a CPU trains no faster as lanes than one "
                "after another (it pays up to ~%d parameters; docs/results/runtimes.md, section Lanes); %s", params,
                CPU_PAYS_UP_TO, "run.batched_min_lanes is set, so lanes it is" if chosen is not None else
                "its clients train one after another, as run.runtime=inprocess (run.batched_min_lanes=1 forces "
                "lanes)")
