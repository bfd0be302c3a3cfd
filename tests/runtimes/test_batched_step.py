"""The vectorized step: the algorithm's own loss re-routed to each lane's tensors, BatchNorm statistics per lane,
and the rule's refusals (runtimes/batched/step.py, rule.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from fedhet_testing import tiny_model
from torch import nn

from fedhet.algorithms.fedprox import proximal_term, trainable
from fedhet.config import TrainConfig
from fedhet.core.contract import LocalPass, LossStep, OptimSpec, Work, loss_pass
from fedhet.core.messages import Message
from fedhet.errors import ConfigError
from fedhet.models import build_model
from fedhet.runtimes.batched.optim import SGD
from fedhet.runtimes.batched.rule import Guard, GuardedRead, check_passes, layout_of, snapshot
from fedhet.runtimes.batched.step import Functional, RoutedWork, functional_copies, stage_step

TRAIN = TrainConfig(local_steps=1, batch_size=8, lr=0.1, momentum=0.0)


@dataclass(kw_only=True)
class AnchorWork(Work):
    """A FedProx-like Work: the model and a tensor field, plus a per-client object the loss must not read."""

    anchor: tuple[torch.Tensor, ...] = ()
    note: Any = field(default_factory=object)


def prox_loss(work: AnchorWork, x: torch.Tensor, y: torch.Tensor, mu: float = 2.0) -> torch.Tensor:
    """FedProx's objective, reading the module's parameters through `parameters()`."""
    ce = nn.functional.cross_entropy(work.model(x), y)
    return ce + 0.5 * mu * proximal_term(trainable(work.model), work.anchor)


def lane(model: nn.Module, shift: float, loss: Any = prox_loss) -> tuple[AnchorWork, list[LocalPass]]:
    """One client's Work (its own anchor) and FedAvg's pass on `loss`."""
    work = AnchorWork(msg=Message(), ctx=None, model=model,  # type: ignore[arg-type]
                      anchor=tuple(p.detach() + shift for p in trainable(model)))
    return work, [loss_pass(model, lambda x, y: loss(work, x, y), TRAIN)]


def routed_lanes(model: nn.Module, shifts: tuple[float, ...]) -> tuple[RoutedWork, Any, dict, dict]:
    """Each client's snapshot, the layout, lane 0's routed Work, and the stacked states / tensor fields."""
    lanes = [snapshot(*lane(model, s)) for s in shifts]
    layout = layout_of("test", lanes)
    check_passes("test", lanes, layout)
    routed = RoutedWork(lanes[0].work, layout, functional_copies(lanes[0].work, layout, {}))
    states = {k: torch.stack([ln.states[k] for ln in lanes]) for k in lanes[0].states}
    tensors = {"anchor": tuple(torch.stack(ts) for ts in zip(*(ln.tensors["anchor"] for ln in lanes), strict=True))}
    return routed, lanes, states, tensors


def torch_step(model: nn.Module, loss: Any, x: torch.Tensor, y: torch.Tensor, lr: float = 0.1) -> dict:
    """The in-process step: torch.optim.SGD on `loss(model, x, y)` (a copy of `model`)."""
    ref = copy.deepcopy(model).train()
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    opt.zero_grad()
    loss(ref, x, y).backward()
    opt.step()
    return ref.state_dict()


def test_inside_the_loss_the_modules_parameters_and_fields_are_the_lanes() -> None:
    torch.manual_seed(0)
    model = tiny_model()
    routed, lanes, states, tensors = routed_lanes(model, (0.0, 1.0))
    one = {k: v[1] for k, v in states.items()}
    work = lanes[0].work
    with routed.bound(one, {"anchor": tuple(t[1] for t in tensors["anchor"])}):
        seen = dict(work.model.named_parameters())
        assert all(seen[k.split(":", 1)[1]] is v for k, v in one.items() if k.split(":", 1)[1] in seen)
        assert torch.equal(work.anchor[0], lanes[1].tensors["anchor"][0])
        with pytest.raises(GuardedRead, match="work.note"):
            _ = work.note.anything
    assert work.model is model and work.anchor is lanes[0].work.anchor and not isinstance(work.note, type(None))


USES = {"attribute": lambda g: g.tensors, "index": lambda g: g["anchor"], "iteration": lambda g: list(g),
        "len": len, "in": lambda g: "mu" in g, "add": lambda g: g + 1.0, "radd": lambda g: 1.0 + g,
        "tensor mul": lambda g: torch.ones(2) * g, "iadd": lambda g: g.__iadd__(1), "neg": lambda g: -g,
        "bool": bool, "compare": lambda g: g < 1, "equal": lambda g: g == 1, "hash": hash, "call": lambda g: g(),
        "float": float, "index()": lambda g: range(g), "format": lambda g: f"{g}", "with": lambda g: g.__enter__(),
        "set attribute": lambda g: setattr(g, "x", 1), "isinstance": lambda g: isinstance(g, dict)}


@pytest.mark.parametrize("use", list(USES), ids=list(USES))
def test_every_use_of_a_guarded_field_refuses_naming_it(use: str) -> None:
    """Rule 5: a Work field the runtime cannot re-route (here a per-client object) refuses any use, naming the
    field, instead of failing inside the loss with another error."""
    guard = Guard("note")
    with pytest.raises(GuardedRead, match=r"work\.note.*\(rule 5\)"):
        USES[use](guard)
    assert "work.note" in repr(guard)


def test_tensors_fields_may_be_lists_and_dicts_and_keep_their_structure_per_lane() -> None:
    """A dict or list of tensors is re-routed like FedProx's tuple: inside the loss it is the lane's, as a dict /
    list; lanes whose structures or shapes differ are refused (rule 6)."""
    torch.manual_seed(0)
    model = tiny_model()
    works = [AnchorWork(msg=Message(), ctx=None, model=model, anchor=(),  # type: ignore[arg-type]
                        note={"a": [p.detach() + i for p in model.parameters()]}) for i in range(2)]
    lanes = [snapshot(w, [loss_pass(model, lambda x, y, w=w: prox_loss(w, x, y), TRAIN)]) for w in works]
    layout = layout_of("test", lanes)
    assert layout.tensors == ["note"] and layout.guarded == ["msg"]  # anchor: () on every lane, left as it is
    routed = RoutedWork(lanes[0].work, layout, functional_copies(lanes[0].work, layout, {}))
    with routed.bound(dict(lanes[1].states), {"note": lanes[1].tensors["note"]}):
        assert isinstance(works[0].note, dict) and isinstance(works[0].note["a"], list)
        assert torch.equal(works[0].note["a"][0], works[1].note["a"][0])
    works[1].note = {"b": works[1].note["a"]}
    with pytest.raises(ConfigError, match=r"work.note has different structures or shapes.*\(rule 6\)"):
        layout_of("test", [lanes[0], snapshot(works[1], lanes[1].passes)])


def test_a_loss_reaching_the_original_module_another_way_is_refused() -> None:
    """Rule 3: a loss that calls the Work's module through a shared holder would train the wrong tensors."""
    torch.manual_seed(0)
    model = tiny_model()
    holder = {"model": model}
    lanes = [snapshot(*lane(model, 0.0, lambda w, x, y: nn.functional.cross_entropy(holder["model"](x), y)))]
    layout = layout_of("test", lanes)
    check_passes("test", lanes, layout)
    routed = RoutedWork(lanes[0].work, layout, functional_copies(lanes[0].work, layout, {}))
    loss_of = lanes[0].passes[0].step.stages[0][0]  # type: ignore[union-attr]
    with pytest.raises(GuardedRead, match=r"calls the module of work.model.*\(rule 3\)"):
        with routed.guarded(), routed.bound(lanes[0].states, {"anchor": lanes[0].tensors["anchor"]}):
            loss_of(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    model(torch.randn(2, 4))  # the guard is gone after the pass


def test_stage_step_is_each_lanes_own_step_with_batchnorm() -> None:
    """Two lanes with different anchors and very different data: each lane's parameters AND BatchNorm running
    statistics equal torch's step on that client (the proximal term sees the lane's parameters and anchor)."""
    torch.manual_seed(0)
    model = tiny_model(in_dim=4, feat_dim=3, bn=True).train()
    routed, lanes, states, tensors = routed_lanes(model, (0.0, 0.5))
    p = lanes[0].passes[0]
    keys = [routed.layout.keys[id(q)] for q in p.optimizers["model"].params]
    opt = SGD(lr=0.1)
    step = stage_step(routed, p.step.stages[0][0], keys, opt, None)  # type: ignore[union-attr]
    x = torch.stack([torch.randn(8, 4), 5 + 3 * torch.randn(8, 4)])
    y = torch.randint(0, 2, (2, 8))
    trained = {k: states[k].clone() for k in keys}
    rest = {k: v for k, v in states.items() if k not in trained}
    new, updates, _, _ = step(trained, rest, tensors, opt.init(trained, (2,)), x, y)
    for c in range(2):
        anchor = lanes[c].tensors["anchor"]
        want = torch_step(model, lambda m, xx, yy, a=anchor: prox_loss(AnchorWork(  # noqa: B023
            msg=Message(), ctx=None, model=m, anchor=a), xx, yy), x[c], y[c])  # type: ignore[arg-type]
        for k, v in want.items():
            got = {**new, **updates}.get(f"model:{k}", states[f"model:{k}"])[c]
            assert torch.allclose(got.double(), v.double(), atol=1e-6), (c, k)
    assert updates["model:features.1.num_batches_tracked"].tolist() == [1, 1]


def test_a_batchnorm_layer_called_twice_updates_its_statistics_twice() -> None:
    torch.manual_seed(0)
    model = tiny_model(bn=True).train()

    def twice(work: AnchorWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(work.model(x), y) + nn.functional.cross_entropy(work.model(2 * x), y)

    lanes = [snapshot(*lane(model, 0.0, twice))]
    layout = layout_of("test", lanes)
    routed = RoutedWork(lanes[0].work, layout, functional_copies(lanes[0].work, layout, {}))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    with routed.bound(lanes[0].states, {"anchor": lanes[0].tensors["anchor"]}) as updates:
        twice(lanes[0].work, x, y)
    ref = copy.deepcopy(model)
    ref(x), ref(2 * x)
    assert torch.allclose(updates["model:features.1.running_mean"], ref.features[1].running_mean, atol=1e-7)
    assert int(updates["model:features.1.num_batches_tracked"]) == 2


def test_rule_refusals() -> None:
    """Rule 1: an own step function; 2: a gradient edit; 3: hooks, an optimizer's parameter outside the Work; 4: a
    loss closing over a lane's own value, or over the module itself (it would not be re-routed)."""
    torch.manual_seed(0)
    model = tiny_model()

    def refused(passes_of: Any, match: str) -> None:
        lanes = []
        for shift in (0.0, 1.0):
            work, _ = lane(model, shift)
            lanes.append(snapshot(work, passes_of(work, shift)))
        with pytest.raises(ConfigError, match=rf"{match}.*run.runtime=inprocess"):
            check_passes("m", lanes, layout_of("m", lanes))

    spec = {"model": OptimSpec(list(model.parameters()))}
    refused(lambda w, s: [LocalPass("local", lambda x, y, o: prox_loss(w, x, y), spec, TRAIN)], r"\(rule 1\)")
    edit = {"model": OptimSpec(list(model.parameters()), after_backward=lambda: None)}
    refused(lambda w, s: [LocalPass("local", LossStep(((lambda x, y: prox_loss(w, x, y), "model"),)), edit, TRAIN)],
            r"\(rule 2\)")
    for other in ({"lr_schedule": lambda t: 1.0}, {"betas": (0.9, 0.98)}):
        odd = {"model": OptimSpec(list(model.parameters()), kind="adamw", **other)}
        refused(lambda w, s, odd=odd: [LocalPass("local", LossStep(((lambda x, y: prox_loss(w, x, y), "model"),)), odd,
                                                 TRAIN)], r"\(rule 2\)")
    stray = {"model": OptimSpec([*model.parameters(), nn.Parameter(torch.zeros(1))])}  # one not in the Work
    refused(lambda w, s: [LocalPass("local", LossStep(((lambda x, y: prox_loss(w, x, y), "model"),)), stray, TRAIN)],
            r"outside the Work's module fields \(rule 3\)")
    refused(lambda w, s: [loss_pass(model, lambda x, y: prox_loss(w, x, y, mu=s), TRAIN)], r"\(rule 4\)")
    refused(lambda w, s: [loss_pass(model, lambda x, y: nn.functional.cross_entropy(model(x), y), TRAIN)],
            r"holds a module.*\(rule 4\)")
    handle = model.head.register_forward_hook(lambda *_: None)
    try:
        refused(lambda w, s: [loss_pass(model, lambda x, y: prox_loss(w, x, y), TRAIN)], r"hooks.*\(rule 3\)")
    finally:
        handle.remove()


def test_dropout_and_unknown_stateful_layers_are_rejected() -> None:
    with pytest.raises(ConfigError, match="run.runtime=inprocess"):
        Functional.of(build_model("small_cnn", 10, (3, 12, 12), width=4, dropout=0.5))

    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    model = tiny_model()
    model.features.append(Counter())
    with pytest.raises(ConfigError, match="keeps buffers"):
        Functional.of(model)
    Functional.of(build_model("small_cnn", 10, (3, 12, 12), width=4, dropout=0.0))  # p = 0 is fine
