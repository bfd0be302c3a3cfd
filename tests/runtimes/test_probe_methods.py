"""Methods a contributor would write from docs/design.md, each keeping what its loss needs in another kind of Work
field, run on every runtime: each either gives the in-process numbers or is refused by name (a ConfigError naming
the field and run.runtime=inprocess). No runtime may fail with any other error (issue 39, item 1).

The probes are registered for this module only (the registry is restored afterwards), so tests that run every
registered method do not see them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fedhet_testing import metric_rows  # noqa: E402

from fedhet.algorithms import ALGORITHMS, Algorithm  # noqa: E402
from fedhet.algorithms.base import NoParams  # noqa: E402
from fedhet.config import load_config  # noqa: E402
from fedhet.core.contract import ClientContext, ClientState, ServerState, Work  # noqa: E402
from fedhet.core.messages import Message  # noqa: E402
from fedhet.engine.experiment import build_experiment  # noqa: E402
from fedhet.engine.safe_load import load_trusted  # noqa: E402
from fedhet.errors import ConfigError  # noqa: E402
from fedhet.launch.run import run_experiment  # noqa: E402

BASE = ["data.dataset=offline_digits", "data.domains=[clean, inverted]", "model.name=small_cnn",
        "model.args={width: 4, norm: none}", "train.local_steps=2", "train.batch_size=8", "train.lr=0.1",
        "data.max_test_per_client=10", "data.augment=false", "rounds=2", "run.quiet=true", "run.device=cpu",
        "run.num_threads=1", "run.batched_min_lanes=1"]


def proximal(model: nn.Module, anchors: Any) -> torch.Tensor:
    """sum ||p - a||^2 over the model's parameters and `anchors` (any iterable of tensors, in parameter order)."""
    return torch.stack([(p - a).pow(2).sum() for p, a in zip(model.parameters(), anchors, strict=True)]).sum()


def copies(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


class Probe(Algorithm[ServerState, ClientState, Any, NoParams]):
    """FedAvg plus one term the subclass's Work feeds its loss; a refusal must name `field` (the Work field)."""

    server_state_type, client_state_type, work_type, Params = ServerState, ClientState, Work, NoParams
    field: str = ""
    batches: bool = False  # what the batched runtime is expected to do: match (True) or refuse by name


@dataclass(kw_only=True)
class DictWork(Work):
    anchor: dict[str, torch.Tensor]


class DictOfTensors(Probe):
    name, work_type, field, batches = "probe_dict", DictWork, "anchor", True

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> DictWork:
        model = self.client_model(msg, state)
        return DictWork(msg=msg, ctx=ctx, model=model,
                        anchor={n: p.detach().clone() for n, p in model.named_parameters()})

    def loss(self, work: DictWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        prox = torch.stack([(p - work.anchor[n]).pow(2).sum() for n, p in work.model.named_parameters()]).sum()
        return F.cross_entropy(work.model(x), y) + 0.5 * prox


@dataclass(kw_only=True)
class ListWork(Work):
    anchor: list[torch.Tensor]


class ListOfTensors(Probe):
    name, work_type, field, batches = "probe_list", ListWork, "anchor", True

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> ListWork:
        model = self.client_model(msg, state)
        return ListWork(msg=msg, ctx=ctx, model=model, anchor=copies(model))

    def loss(self, work: ListWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(work.model(x), y) + 0.5 * proximal(work.model, work.anchor[::-1][::-1])


@dataclass
class Anchor:
    tensors: list[torch.Tensor]
    weight: float


@dataclass(kw_only=True)
class NestedWork(Work):
    extra: Anchor


class NestedDataclass(Probe):
    name, work_type, field = "probe_nested", NestedWork, "extra"

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> NestedWork:
        model = self.client_model(msg, state)
        return NestedWork(msg=msg, ctx=ctx, model=model, extra=Anchor(copies(model), 0.5))

    def loss(self, work: NestedWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(work.model(x), y) + work.extra.weight * proximal(work.model, work.extra.tensors)


@dataclass(kw_only=True)
class ScalarWork(Work):
    weight: float


class PerClientScalar(Probe):
    name, work_type, field = "probe_scalar", ScalarWork, "weight"

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> ScalarWork:
        weight = 1.0 + ctx.client_id / 2  # a number that differs between clients
        return ScalarWork(msg=msg, ctx=ctx, model=self.client_model(msg, state), weight=weight)

    def loss(self, work: ScalarWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return work.weight * F.cross_entropy(work.model(x), y)


@dataclass(kw_only=True)
class MixedWork(Work):
    state: dict[str, Any]


class MixedDict(Probe):
    """The issue's crash: a dict holding tensors and a per-client number, iterated in the loss."""

    name, work_type, field = "probe_mixed", MixedWork, "state"

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> MixedWork:
        model = self.client_model(msg, state)
        mu = 0.1 * (1 + ctx.client_id)  # differs between clients
        return MixedWork(msg=msg, ctx=ctx, model=model, state={"anchor": copies(model), "mu": mu})

    def loss(self, work: MixedWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mu, anchor = (work.state[k] for k in ("mu", "anchor"))
        return F.cross_entropy(work.model(x), y) + mu * proximal(work.model, anchor)


@dataclass(kw_only=True)
class TeacherWork(Work):
    teacher: nn.Module


class SecondModel(Probe):
    """docs/design.md's example: distillation from a frozen copy of the received model."""

    name, work_type, field, batches = "probe_teacher", TeacherWork, "teacher", True

    def start(self, msg: Message, state: ClientState, ctx: ClientContext) -> TeacherWork:
        model = self.client_model(msg, state)
        teacher = self.parts.spare("teacher")
        teacher.load_state_dict(model.state_dict())
        return TeacherWork(msg=msg, ctx=ctx, model=model, teacher=teacher.eval().requires_grad_(False))

    def loss(self, work: TeacherWork, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = work.model(x)
        with torch.no_grad():
            target = F.softmax(work.teacher(x) / 2, dim=1)
        kd = F.kl_div(F.log_softmax(logits / 2, dim=1), target, reduction="batchmean") * 4
        return F.cross_entropy(logits, y) + kd


class NumpyInTheLoss(Probe):
    """Class weights counted with numpy: fine in-process, impossible on a vmapped (storage-less) batch (rule 7)."""

    name, field = "probe_numpy", "(rule 7)"

    def loss(self, work: Work, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        counts = torch.as_tensor(np.bincount(y.numpy(), minlength=self.num_classes), dtype=torch.float32)
        return F.cross_entropy(work.model(x), y, weight=1.0 / counts.clamp(min=1.0))


class BrokenLoss(Probe):
    """A loss that fails in-process too: its own error, on every runtime, not a refusal."""

    name = "probe_broken"

    def loss(self, work: Work, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(work.model(x), y) * {"weights": 1.0}["weight"]


PROBES: list[type[Probe]] = [DictOfTensors, ListOfTensors, NestedDataclass, PerClientScalar, MixedDict, SecondModel,
                             NumpyInTheLoss]


@pytest.fixture(scope="module", autouse=True)
def probes_registered() -> Iterator[None]:
    ALGORITHMS.load()  # the built-ins first, so that they are kept
    items = ALGORITHMS._items  # noqa: SLF001 - for this module only, restored below
    before = dict(items)
    items.update({p.name: p for p in [*PROBES, BrokenLoss]})
    yield
    items.clear()
    items.update(before)


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return metric_rows(run_dir)


def refused_by_name(probe: type[Probe], run: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, None) if `run` is refused by name, else (False, what it returned); any other exception fails."""
    try:
        return False, run()
    except ConfigError as e:
        named = probe.field if probe.field.startswith("(") else f"work.{probe.field}"
        assert named in str(e) and "run.runtime=inprocess" in str(e), e
        return True, None


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_probe_runs_as_inprocess_or_is_refused_by_name_on_the_batched_runtime(tmp_path: Path, probe: type[Probe]
                                                                             ) -> None:
    c = [*BASE, f"method={probe.name}"]
    run_experiment(load_config(None, c), tmp_path / "inprocess", progress=False)
    refused, _ = refused_by_name(probe, lambda: run_experiment(load_config(None, [*c, "run.runtime=batched"]),
                                                               tmp_path / "batched", progress=False))
    assert refused is not probe.batches
    if refused:
        return
    want, got = rows(tmp_path / "inprocess"), rows(tmp_path / "batched")
    assert [(r["round"], r["client"], r["split"]) for r in want] == [(r["round"], r["client"], r["split"]) for r in got]
    for a, b in zip(want, got, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5) and b["accuracy"] == a["accuracy"], (a, b)


@pytest.mark.usefixtures("private_flower_home", "task_identity")
@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_probe_runs_as_inprocess_on_flower(tmp_path: Path, probe: type[Probe]) -> None:
    """Flower's own Strategy.start with fedhet's strategy and ClientApp on an in-process grid: the in-process
    global model, bit for bit (every probe runs there: Flower clients run the in-process code)."""
    pytest.importorskip("flwr")
    from flower_testing import AppGrid

    from fedhet.runtimes.flower.strategy import FedhetStrategy, fedhet_client_app

    c = load_config(None, [*BASE, f"method={probe.name}"])
    run_experiment(c, tmp_path / "inprocess", progress=False)
    exp = build_experiment(c)
    server = load_trusted(tmp_path / "inprocess" / "checkpoints" / "latest.pt", "checkpoint")["server"]
    expected = exp.algorithm.server_model(server).state_dict()
    strategy = FedhetStrategy(c)
    grid = AppGrid([fedhet_client_app(config=c)] * 2)
    refused, result = refused_by_name(probe, lambda: strategy.start(
        grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=c.rounds))
    assert not refused
    got = result.arrays.to_torch_state_dict()
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def test_a_loss_failing_in_process_too_fails_with_its_own_error_on_the_batched_runtime(tmp_path: Path) -> None:
    """Only a loss that runs in-process is refused (rule 7) when it fails vectorized; a bug of the method's own is
    its own error on both runtimes."""
    c = [*BASE, "method=probe_broken"]
    for runtime in ("inprocess", "batched"):
        with pytest.raises(KeyError, match="weight"):
            run_experiment(load_config(None, [*c, f"run.runtime={runtime}"]), tmp_path / runtime, progress=False)


@pytest.mark.parametrize("method", ["feddyn", "fednova"])
def test_feddyn_and_fednova_written_from_the_docs_batch(method: str) -> None:
    """The two baselines written from docs/design.md alone pass the rule (FedDyn's Work holds dicts of tensors);
    tests/runtimes/test_batched_runtime.py::test_every_method_the_rule_accepts_matches_inprocess compares them."""
    from fedhet.launch.run import make_executor
    from fedhet.runtimes.batched import BatchedClients

    exp = build_experiment(load_config(None, [*BASE, f"method={method}", "run.runtime=batched"]))
    assert isinstance(make_executor(exp), BatchedClients)


@pytest.mark.slow
@pytest.mark.usefixtures("private_flower_home")
@pytest.mark.parametrize("method", ["feddyn", "fednova"])
def test_feddyn_and_fednova_on_flowers_simulation_engine(tmp_path: Path, method: str) -> None:
    """On Flower's simulation engine (Ray): the in-process metric rows, exactly (slow: a Ray start per run)."""
    pytest.importorskip("flwr")
    from fedhet.runtimes.flower.simulation import run_flower_simulation

    c = load_config(None, [*BASE, f"method={method}"])
    run_experiment(c, tmp_path / "inprocess", progress=False)
    run_flower_simulation(c, tmp_path / "sim", num_cpus=2)
    assert rows(tmp_path / "sim") == rows(tmp_path / "inprocess")
