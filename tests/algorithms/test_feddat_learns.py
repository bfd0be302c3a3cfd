"""FedDAT learns on a tiny easy-VQA split (Task: four clients, 64-128 questions each, a C^k-way head each) over a
frozen backbone pretrained for a few seconds on the source images, and keeps Alg. 1's invariants in every fit of
the run: A_c never in a reply, Â_s still the received A_s when the fit ends. A broken variant fails the same
check: A_c sent to the server, or Â_s trained with A_c (the whole DAT block trainable)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("easy_vqa")

from fedhet.algorithms.feddat import FedDAT  # noqa: E402
from fedhet.config import load_config  # noqa: E402
from fedhet.launch.pretrain import pretrain_backbone  # noqa: E402
from fedhet.launch.run import run_experiment  # noqa: E402
from fedhet.models.peft.adapters import BottleneckAdapter  # noqa: E402
from fedhet.models.peft.insertion import adapter_named_parameters  # noqa: E402
from fedhet.runtimes import inprocess  # noqa: E402

MODEL = "d: 64, depth: 1, heads: 4, patch: 8"
COMMON = ["model.name=vl_transformer", "train.optimizer=adamw", "run.num_threads=1", "run.quiet=true"]
CHANCE = (1 / 2 + 1 / 3 + 1 / 4 + 1 / 4) / 4  # the Task clients' pools: 2, 3, 4 and 4 answers


@pytest.fixture(scope="module")
def backbone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("backbone") / "backbone.pt"
    cfg = load_config(None, [*COMMON, "data.dataset=easy_vqa_source", f"model.args={{{MODEL}}}", "train.lr=0.003",
                             "train.batch_size=64"])
    pretrain_backbone(cfg, out, epochs=3)
    return out


def problems_of_a_run(monkeypatch: pytest.MonkeyPatch, backbone: Path, out: Path) -> tuple[list[str], float]:
    """Run FedDAT for 8 rounds; return what broke Alg. 1 in any fit, and the final average test accuracy."""
    started: list[Any] = []
    real_start, real_fit = FedDAT.start, inprocess.fit_client
    problems: list[str] = []

    def start(self: FedDAT, msg: Any, state: Any, ctx: Any) -> Any:
        started.append(real_start(self, msg, state, ctx))
        return started[-1]

    def fit(alg: Any, msg: Any, state: Any, ctx: Any, **kwargs: Any) -> Any:
        out, new = real_fit(alg, msg, state, ctx, **kwargs)
        problems.extend(f"round {ctx.round}: {k} sent" for k in out.arrays if ".slots.shared." not in k)
        for name, p in adapter_named_parameters(started[-1].model, "frozen_shared"):
            if not torch.equal(p, msg.arrays[name.replace(".slots.frozen_shared.", ".slots.shared.")]):
                problems.append(f"round {ctx.round}: {name} moved away from the received A_s")
        return out, new

    monkeypatch.setattr(FedDAT, "start", start)
    monkeypatch.setattr(inprocess, "fit_client", fit)
    cfg = load_config(None, [*COMMON, "data.dataset=easy_vqa_task", f"model.args={{{MODEL}, checkpoint: {backbone}}}",
                             "method=feddat", "rounds=8", "train.batch_size=16", "train.lr=0.01", "eval.every=8"])
    result = run_experiment(cfg, out)
    return problems, result.final["avg"]["accuracy"]


def test_feddat_learns_and_keeps_A_c_home_and_the_frozen_copy_frozen(monkeypatch, backbone, tmp_path) -> None:
    problems, accuracy = problems_of_a_run(monkeypatch, backbone, tmp_path)
    assert problems == []
    assert accuracy > CHANCE + 0.15, f"FedDAT's average accuracy {accuracy:.3f} is not well above chance {CHANCE:.3f}"


def a_c_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    def shared_keys(self: FedDAT, model: torch.nn.Module) -> set[str]:
        return set(self.peft.communicated) | {n for n, _ in adapter_named_parameters(model, "client")}

    monkeypatch.setattr(FedDAT, "shared_keys", shared_keys)


def frozen_copy_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Â_s a trainable part of the DAT: its weights not detached, and in A_c's optimizer (or the single one)."""
    real_passes = FedDAT.passes
    monkeypatch.setattr(BottleneckAdapter, "forward_frozen", BottleneckAdapter.forward)

    def passes(self: FedDAT, work: Any) -> Any:
        frozen = [p.requires_grad_(True) for _, p in adapter_named_parameters(work.model, "frozen_shared")]
        out = real_passes(self, work)
        name = "client" if "client" in out[0].optimizers else "model"  # the official update has one optimizer
        spec = out[0].optimizers[name]
        out[0].optimizers[name] = dataclasses.replace(spec, params=[*spec.params, *frozen])
        return out

    monkeypatch.setattr(FedDAT, "passes", passes)


@pytest.mark.parametrize("break_it", [a_c_sent, frozen_copy_trains], ids=["A_c sent", "frozen copy trains"])
def test_a_broken_variant_fails_the_same_check(monkeypatch, backbone, tmp_path, break_it) -> None:
    break_it(monkeypatch)
    problems, _ = problems_of_a_run(monkeypatch, backbone, tmp_path)
    assert problems, f"{break_it.__name__}: the check found nothing wrong"
