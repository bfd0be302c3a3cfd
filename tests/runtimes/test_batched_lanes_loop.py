"""PassRunner.run's bookkeeping (lanes.py): each lane's loss and its NaN flag land on that lane, whether every lane
takes the step together or lanes of unequal batch sizes take it in groups."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.config import load_config
from fedhet.core.seeding import FIT, client_stream
from fedhet.engine.experiment import build_experiment
from fedhet.runtimes.batched import BatchedClients
from fedhet.runtimes.batched.data import ClientRng
from fedhet.runtimes.inprocess import FitJob

CFG = ["data.dataset=offline_digits", "model.name=mlp", "model.args={hidden: [8]}", "train.local_steps=2",
       "train.batch_size=4", "run.quiet=true", "run.device=cpu", "run.num_threads=1", "run.runtime=batched",
       "run.batched_min_lanes=1"]


class Stream:
    """`steps` batches of `size` rows of value `fill` (the interface of data.BatchStream)."""

    def __init__(self, steps: int, size: int, fill: float, shape: tuple[int, ...]) -> None:
        self.steps, self.size, self.fill, self.shape = steps, size, fill, shape

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((self.size, *self.shape), self.fill), torch.zeros(self.size, dtype=torch.long)


@pytest.mark.parametrize("sizes", [(4, 4, 4), (4, 3, 4)])
def test_losses_and_divergence_stay_on_their_lane(sizes: tuple[int, ...]) -> None:
    exp = build_experiment(load_config(None, CFG))
    rt = BatchedClients(exp)
    alg = exp.algorithm
    jobs = [FitJob(alg, c, alg.broadcast(alg.init_server(), exp.round_info(1), c), rt.states[c]) for c in range(3)]
    lanes = [rt._lane(j, 1, ClientRng(*client_stream(0, 1, j.cid, FIT))) for j in jobs]
    state = {k: torch.stack([lane.states[k] for lane in lanes]) for k in lanes[0].states}
    state_before = {k: v.clone() for k, v in state.items()}
    runner = rt._runner(lanes, 0, rt._check(lanes), [{} for _ in jobs], state)
    fills = (5.0, math.nan, 0.0)
    streams = [Stream(2, n, f, exp.data.input_shape) for n, f in zip(sizes, fills, strict=True)]
    result = runner.run(streams, {})
    assert result.diverged == [False, True, False] and math.isnan(result.stats[1].loss)
    assert [s.examples for s in result.stats] == [2 * n for n in sizes]
    for i in (0, 2):  # each lane's loss is the one it has alone
        alone = {k: v[i:i + 1].clone() for k, v in state_before.items()}
        single = rt._runner([lanes[i]], 0, rt._check([lanes[i]]), [{}], alone).run([streams[i]], {})
        assert result.stats[i].loss == pytest.approx(single.stats[0].loss, abs=1e-6)
    assert abs(result.stats[0].loss - result.stats[2].loss) > 1e-3
