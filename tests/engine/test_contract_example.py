"""The 30-line method in docs/design.md runs as written (nothing injected: its imports and its `@register` are the
page's), and its distillation term does what it says."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from fedhet_testing import tiny_client, tiny_model

from fedhet.algorithms import ALGORITHMS
from fedhet.config import ServerConfig, TrainConfig
from fedhet.core.contract import ClientContext, RoundInfo
from fedhet.engine.local import fit_client

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def example_class() -> type:
    """Run the page's python block as written (its own imports, its real `@register`), in a module of its own;
    the method registry is restored afterwards."""
    block = re.search(r"```python\n(.*?)```", DESIGN.read_text(), re.DOTALL)
    assert block is not None, "docs/design.md lost its example method"
    assert len(block.group(1).split("\n\n\n", 1)[-1].splitlines()) <= 35  # the method, after its imports
    module = types.ModuleType("design_example")
    before = (ALGORITHMS.names(), dict(ALGORITHMS._items))[1]  # the built-ins loaded first, then kept
    sys.modules[module.__name__] = module  # `@dataclass` looks its class's module up
    try:
        exec(compile(block.group(1), str(DESIGN), "exec"), module.__dict__)  # noqa: S102 - our own documentation
        registered = ALGORITHMS.get("example_teacher")
    finally:
        del sys.modules[module.__name__]
        ALGORITHMS._items.clear()
        ALGORITHMS._items.update(before)
    assert registered is module.FedTeacher
    return registered


def test_the_documented_method_trains_and_its_loss_is_ce_plus_kd() -> None:
    cls = example_class()
    torch.manual_seed(0)
    template = tiny_model(in_dim=4, feat_dim=3, num_classes=2)
    alg = cls(cls.Params(weight=0.5, temperature=2.0), lambda: template, TrainConfig(lr=0.1, batch_size=8,
              local_steps=2, momentum=0.0), ServerConfig(), 2, torch.device("cpu"))
    data = tiny_client(n=8)
    ctx = ClientContext(client_id=0, info=RoundInfo(round=1, rounds=1, num_clients=1, seed=0), data=data,
                        device=torch.device("cpu"), num_classes=2)
    msg = alg.broadcast(alg.init_server(), ctx.info, 0)
    work = alg.start(msg, alg.init_client(0), ctx)
    x, y = data.train.tensors
    # at the start the student equals the teacher: the KL term is 0, the loss is the cross-entropy
    assert torch.allclose(alg.loss(work, x, y), F.cross_entropy(work.model(x), y), atol=1e-6)
    with torch.no_grad():  # a different student: the KL term is positive and weighted by weight * T^2
        work.model.head.bias.add_(1.0)
    logits, t = work.model(x), 2.0
    kd = F.kl_div(F.log_softmax(logits / t, 1), F.softmax(work.teacher(x) / t, 1), reduction="batchmean") * t * t
    assert kd > 0
    assert torch.allclose(alg.loss(work, x, y), F.cross_entropy(logits, y) + 0.5 * kd, atol=1e-6)
    out, state = fit_client(alg, msg, alg.init_client(0), ctx)
    assert out.scalars["steps"] == 2 and set(out.arrays) == set(msg.arrays)
    assert any(not torch.equal(out.arrays[k], msg.arrays[k]) for k in msg.arrays)
