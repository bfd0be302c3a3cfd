"""Fed-SFDA: the style wave's messages, the SWA teacher, L_KD and L_PSEUDO by hand, labels never read, and a
2-round run through the engine on two built-in digit domains (source: clean, target: inverted)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fedhet_testing import metric_rows

from fedhet.algorithms.fed_sfda import BAND, STYLE, FedSFDA, FedSFDAParams
from fedhet.algorithms.fed_sfda_parts import kd_loss, pseudo_label_loss, swa_update
from fedhet.config import load_config
from fedhet.data.fda import style_of
from fedhet.engine.experiment import Experiment, build_experiment
from fedhet.engine.local import fit_client
from fedhet.errors import ConfigError
from fedhet.launch.run import run_experiment

torch.set_num_threads(1)

BASE = ["method=fed_sfda", "data.dataset=offline_digits", "data.domains=[inverted]", "data.partition=iid",
        "data.num_clients=2", "data.max_train_per_client=30", "data.max_test_per_client=20", "data.image_size=16",
        "data.augment=false", "model.name=small_cnn", "model.args={width: 4}", "train.batch_size=8",
        "train.lr=0.05", "train.local_steps=2", "run.quiet=true", "run.device=cpu", "run.num_threads=1",
        "method_args={source: {dataset: offline_digits, domains: [clean], image_size: 16, "
        "max_train_per_client: 40}, beta: 0.13, pretrain_epochs: 1}"]


def experiment(*overrides: str) -> Experiment:
    return build_experiment(load_config(None, [*BASE, *overrides]))


def test_style_wave_sends_the_style_only() -> None:
    """Round 1: the server sends no array, only the band; the client replies with one C x (2b+1) x (2b+1) array
    (the mean low band of its images, fewer numbers than one image) and scalars; no pixel tensor leaves it."""
    exp = experiment()
    alg, server = exp.algorithm, exp.init_server()
    msg = alg.broadcast(server, exp.round_info(1), 0)
    b = math.floor(16 * 0.13)
    assert msg.arrays == {} and msg.scalars == {BAND: b}
    reply, _ = fit_client(alg, msg, alg.init_client(0), exp.context(0, 1))
    images = torch.stack([x for x, _ in exp.data.clients[0].train_eval])
    assert set(reply.arrays) == {STYLE} and reply.arrays[STYLE].shape == (3, 2 * b + 1, 2 * b + 1)
    assert reply.num_params() < images[0].numel()
    assert torch.allclose(reply.arrays[STYLE], style_of(images, b), atol=1e-4)
    assert all(isinstance(v, int | float) for v in reply.scalars.values())
    assert alg.reply_layout(msg) == {STYLE: ((3, 2 * b + 1, 2 * b + 1), torch.float32)}


def test_swa_update_by_hand() -> None:
    teacher = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(5)}
    student = {"w": torch.tensor([4.0, 8.0]), "steps": torch.tensor(9)}
    new = swa_update(teacher, student, 2)  # (w_g * 2 + w_c) / 3
    assert torch.allclose(new["w"], torch.tensor([2.0, 4.0])) and int(new["steps"]) == 9
    assert torch.equal(swa_update(teacher, student, 0)["w"], student["w"])


def test_swa_teacher_follows_the_papers_schedule() -> None:
    """t_START = 3, omega = 2: the teacher is the source model until round 3, then s3, (s3 + s5) / 2 and
    (s3 + s5 + s7) / 3 of the client's own students s_t (the students of rounds 4 and 6 are not averaged)."""
    exp = experiment("method_args.t_start=3", "method_args.omega=2")
    alg = exp.algorithm
    server = dataclasses.replace(exp.init_server(), pretrained=True)
    source, state, students = dict(server.model), alg.init_client(0), {}

    def mean(*rounds: int) -> dict[str, torch.Tensor]:
        return {k: sum(students[r][k] for r in rounds) / len(rounds) for k in source}

    for rnd in range(2, 8):
        msg = alg.broadcast(server, exp.round_info(rnd), 0)
        reply, state = fit_client(alg, msg, state, exp.context(0, rnd))
        students[rnd] = reply.arrays
        server = dataclasses.replace(server, model=reply.arrays)  # one client: FedAvg is its model
        averaged = {2: (), 3: (3,), 4: (3,), 5: (3, 5), 6: (3, 5), 7: (3, 5, 7)}[rnd]
        want = mean(*averaged) if averaged else source
        for k, v in want.items():
            if source[k].is_floating_point():
                assert torch.allclose(state.teacher[k], v, atol=1e-6), (rnd, k)
    assert state.swa_n == 3


def test_kd_loss_is_kl_teacher_to_student_by_hand() -> None:
    s, t, temp = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([[0.0, 0.5, 4.0]]), 2.0
    ps, pt = F.softmax(s / temp, dim=1), F.softmax(t / temp, dim=1)
    want = float((pt * (pt.log() - ps.log())).sum()) * temp ** 2  # KL(teacher || student) T^2
    reverse = float((ps * (ps.log() - pt.log())).sum()) * temp ** 2
    assert kd_loss(s, t, temp).item() == pytest.approx(want, rel=1e-5)
    assert abs(want - reverse) > 1e-2  # the direction matters here
    student, teacher = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    kd_loss(student, teacher, temp).backward()
    assert teacher.grad is None or not teacher.grad.any()  # nothing reaches the teacher
    moved = (s - 0.5 * student.grad).detach()  # a descent step brings the student towards the teacher
    assert kd_loss(moved, t, temp) < kd_loss(s, t, temp)


def test_pseudo_labels_are_the_confident_teacher_argmax() -> None:
    teacher = torch.tensor([[4.0, 0.0], [0.2, 0.0], [0.0, 5.0]])  # confidences 0.982, 0.550, 0.993
    student = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 0.0]])
    loss, mask = pseudo_label_loss(student, teacher, threshold=0.9)
    assert mask.tolist() == [True, False, True]
    ce = F.cross_entropy(student, torch.tensor([0, 0, 1]), reduction="none")
    assert loss.item() == pytest.approx(float(ce[0] + ce[2]) / 3, rel=1e-6)  # FixMatch: mean over the batch
    assert pseudo_label_loss(student, teacher, threshold=0.99)[1].tolist() == [False, False, True]
    assert pseudo_label_loss(student, teacher, threshold=1.0)[0].item() == 0.0


def test_adaptation_never_reads_the_clients_labels() -> None:
    exp = experiment()
    alg = exp.algorithm
    server = dataclasses.replace(exp.init_server(), pretrained=True)
    msg = alg.broadcast(server, exp.round_info(2), 0)
    torch.manual_seed(0)
    reply, _ = fit_client(alg, msg, alg.init_client(0), exp.context(0, 2))
    client = exp.data.clients[0]
    shuffled = dataclasses.replace(client, train=[(x, (y + 3) % 10) for x, y in client.train])
    torch.manual_seed(0)
    again, _ = fit_client(alg, msg, alg.init_client(0), exp.context(0, 2, shuffled))
    for k, v in reply.arrays.items():
        assert torch.equal(v, again.arrays[k]), k


@pytest.mark.parametrize("bn_stats", ["target", "source"])
def test_bn_stats_source_keeps_the_source_models_running_statistics(bn_stats: str) -> None:
    exp = experiment(f"method_args.bn_stats={bn_stats}")
    alg = exp.algorithm
    server = dataclasses.replace(exp.init_server(), pretrained=True)
    msg = alg.broadcast(server, exp.round_info(2), 0)
    torch.manual_seed(0)
    reply, _ = fit_client(alg, msg, alg.init_client(0), exp.context(0, 2))
    stats = [k for k in reply.arrays if k.endswith(("running_mean", "running_var"))]
    weights = [k for k in reply.arrays if k.endswith("weight")]
    assert stats and weights
    kept = [torch.equal(reply.arrays[k], msg.arrays[k]) for k in stats]
    assert all(kept) if bn_stats == "source" else not any(kept)
    assert not all(torch.equal(reply.arrays[k], msg.arrays[k]) for k in weights)  # the student still trains


def test_mismatched_image_sizes_and_bad_params_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="method_args.source.image_size"):
        run_experiment(load_config(None, [*BASE, "data.image_size=20", "rounds=1"]), tmp_path, progress=False)
    for bad in ({"threshold": 1.5}, {"t_start": 1}, {"kd_teacher": "ema"}, {"beta": 0.6},
                {"bn_stats": "frozen"}):
        with pytest.raises(ConfigError):
            FedSFDAParams(**bad).validate()  # type: ignore[arg-type]


def test_two_rounds_through_the_engine(tmp_path: Path) -> None:
    """Round 1 pre-trains (its accuracy is the source-only model's), round 2 adapts; both runs are reproducible."""
    cfg = load_config(None, [*BASE, "rounds=2", "eval.every=1", "method_args.kd_teacher=source",
                             "method_args.pretrain_epochs=8", "method_args.deploy=teacher"])
    result = run_experiment(cfg, tmp_path / "a", progress=False)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    avg = [r for r in rows if r["client"] == "avg" and r["split"] == "test"]
    assert [r["round"] for r in avg] == [1, 2] and avg[0]["accuracy"] > 0.1  # chance is 0.1
    again = run_experiment(cfg, tmp_path / "b", progress=False)
    assert metric_rows(again.run_dir) == metric_rows(result.run_dir)  # all but the measured train_time_s
    assert isinstance(build_experiment(cfg).algorithm, FedSFDA)
