"""Attacks on a run's real uploads: inversion (`fedhet privacy RUN_DIR --attack inversion`) and membership
inference on the server's view (`--view server`), on tiny runs of offline digits at 8 x 8, and their bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from fedhet.algorithms.fedavg import FedAvg
from fedhet.cli import main
from fedhet.config import load_config
from fedhet.core.messages import Message
from fedhet.core.params import BN_TYPES, keys_of_types
from fedhet.errors import FedhetError
from fedhet.launch.run import run_experiment
from fedhet.privacy.inversion import LocalSGD
from fedhet.privacy.invert_run import invert_run, observed
from fedhet.privacy.rundir import PRIVACY_FILE, attacked_run, evaluate_run
from fedhet.privacy.scores import sample_scores
from fedhet.privacy.server_view import evaluate_server_view
from fedhet.privacy.uploads import Upload, client_upload, server_copy

TINY = ["data.dataset=offline_digits", "rounds=1", "train.local_steps=2", "train.batch_size=16", "run.quiet=true",
        "data.augment=false", "data.image_size=8"]
MLP = ["model.name=mlp", "model.args.hidden=[16]"]
RUNS = {"fedavg": [*MLP, "method=fedavg"], "all": [*MLP, "method=all"], "scaffold": [*MLP, "method=scaffold"],
        "local_dp": [*MLP, "method=fedavg", "privacy.dp.mode=local", "privacy.dp.clip=0.1",
                     "privacy.dp.noise_multiplier=1.0", "privacy.dp.delta=0.01"],
        "fedbn": ["model.name=small_cnn", "model.args.width=4", "model.args.embed_dim=8", "method=fedbn"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("upload_runs")
    for name, extra in RUNS.items():
        run_experiment(load_config(None, [*TINY, *extra]), root / name)
    return {name: root / name for name in RUNS}


def test_dlg_inverts_a_fedavg_upload_and_keeps_older_entries(runs: dict[str, Path]) -> None:
    deployed = evaluate_run(runs["fedavg"], progress=False)
    result = invert_run(runs["fedavg"], "colored", batch=1, iters=100, method="dlg", restarts=4)
    assert result["psnr"] > 25.0 and result["ssim"] > 0.9
    assert (result["labels"], result["label_correct"], result["client"]) == ("inferred", True, "colored")
    assert result["matched_keys"] == ["features.1.bias", "features.1.weight", "head.bias", "head.weight"]
    saved = json.loads((runs["fedavg"] / PRIVACY_FILE).read_text())
    assert saved["inversion_dlg_colored_b1_k1"] == json.loads(json.dumps(result))
    assert saved["train_vs_test"] == json.loads(json.dumps(deployed))


def test_a_local_dp_upload_is_not_inverted(runs: dict[str, Path]) -> None:
    clean = invert_run(runs["fedavg"], "colored", batch=1, iters=100, method="dlg", restarts=4, write=False)
    noised = invert_run(runs["local_dp"], "colored", batch=1, iters=100, method="dlg", restarts=4, write=False)
    assert noised["local_dp"] and not clean["local_dp"]
    assert clean["psnr"] > 25.0 > 15.0 > noised["psnr"]


def test_fedbn_inversion_never_reads_batchnorm(runs: dict[str, Path]) -> None:
    with attacked_run(runs["fedbn"]) as run:
        bn = keys_of_types(run.exp.algorithm.parts.template, BN_TYPES)
        cid = 1
        upload = client_upload(run, cid)
        assert bn and not bn & set(upload.received.arrays) and not bn & set(upload.sent.arrays)
        obs = observed(run, upload, LocalSGD(0.01), None)
        assert not bn & set(obs.update)
        client_bn = run.states[cid].local  # what the client keeps: the attacker's copy holds the initial values
        init = run.exp.algorithm.parts.init_state
        state = obs.model.state_dict()
        assert any(not torch.equal(client_bn[k], init[k]) for k in bn)
        assert all(torch.equal(state[k].cpu(), init[k].cpu()) for k in bn)
    result = invert_run(runs["fedbn"], "colored", batch=2, iters=20, method="ig", write=False)
    assert result["labels"] == "given" and not any(k in bn for k in result["matched_keys"])


def test_server_view_attacks_the_upload(runs: dict[str, Path]) -> None:
    result = evaluate_server_view(runs["fedavg"], progress=False)
    assert set(result["clients"]) == {"clean", "inverted", "colored", "thick_blur"} and result["view"] == "server"
    deployed = evaluate_run(runs["fedavg"], progress=False, write=False)
    with attacked_run(runs["fedavg"]) as run:
        train = dataclasses.replace(run.exp.config.train, local_steps=None)
        upload = client_upload(run, 0, train=train)
        uploaded = server_copy(run, upload.received.arrays)
        members = run.exp.data.clients[0].train_eval
        loss = sample_scores(uploaded, members, run.exp.device)["loss"].mean()
    clean = result["clients"]["clean"]
    assert clean["loss"]["member_mean"] == pytest.approx(float(loss), rel=1e-9)
    assert clean["loss"]["member_mean"] != pytest.approx(deployed["clients"]["clean"]["loss"]["member_mean"])
    for report in result["clients"].values():  # the round trained on the members: their loss dropped
        assert report["loss_change"]["member_mean"] < 0.0
    assert 0.5 <= result["pooled"]["loss_change"]["attack_accuracy"] <= 1.0
    assert json.loads((runs["fedavg"] / PRIVACY_FILE).read_text())["server_train_vs_test"]["view"] == "server"


def test_cli(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", str(runs["fedavg"]), "--attack", "inversion", "--iters", "5", "--method", "dlg"]) == 0
    out = capsys.readouterr().out
    assert "inversion (dlg, 5 iterations) of client clean's upload" in out and "PSNR dB" in out
    assert main(["privacy", str(runs["fedavg"]), "--view", "server", "-q"]) == 0
    assert "change AUC" in capsys.readouterr().out
    assert main(["privacy", str(runs["fedavg"]), "--attack", "inversion", "--client", "mnist"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "client 'mnist' is not a training client" in err[0] and "clean, inverted" in err[0]


def test_bad_input(runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = (runs["fedbn"] / PRIVACY_FILE).read_bytes() if (runs["fedbn"] / PRIVACY_FILE).exists() else None
    with pytest.raises(FedhetError, match="--batch 1000 is larger than client 'clean''s 360 training samples"):
        invert_run(runs["fedbn"], batch=1000)
    with pytest.raises(FedhetError, match="BatchNorm1d.*--batch 2"):
        invert_run(runs["fedbn"], batch=1)
    with pytest.raises(FedhetError, match="give a method among dlg, ig"):
        invert_run(runs["fedbn"], method="lbfgs")
    assert before == ((runs["fedbn"] / PRIVACY_FILE).read_bytes() if before is not None else None)
    for attack in (invert_run, evaluate_server_view):
        with pytest.raises(FedhetError, match="method 'all' trains on the pooled data"):
            attack(runs["all"])
        with pytest.raises(FedhetError, match="'scaffold' uploads no weights of the model under their own names .it "
                                              "sends dc/"):  # its update in its own form, dy/<key>
            attack(runs["scaffold"])
    monkeypatch.setattr(FedAvg, "one_shot", True)
    with pytest.raises(FedhetError, match="is one-shot: its clients upload once"):
        invert_run(runs["fedavg"])
    monkeypatch.undo()
    no_weights = "uploads no weights of the model under their own names .it sends dy/head.bias, latents"
    with attacked_run(runs["fedavg"]) as run, pytest.raises(FedhetError, match=no_weights):
        sent = Message(arrays=dict(run.server.model))
        received = Message(arrays={"latents": torch.zeros(2), "dy/head.bias": torch.zeros(10)})
        observed(run, Upload(sent, received, 1), LocalSGD(0.1), None)
    shutil.copy(runs["fedavg"] / "config.yaml", tmp_path / "config.yaml")
    for attack in (invert_run, evaluate_server_view):
        with pytest.raises(FedhetError, match="has no checkpoint"):
            attack(tmp_path)


def test_the_attackers_sgd_is_the_runs_own() -> None:
    """lr, momentum and weight decay of the simulated local training come from the run's train config (a dropped
    weight decay or momentum makes every simulated update wrong)."""
    from types import SimpleNamespace

    from fedhet.privacy.invert_run import local_sgd

    cfg = load_config(None, [*TINY, *MLP, "train.lr=0.07", "train.momentum=0.6", "train.weight_decay=0.003"])
    train, sgd = local_sgd(SimpleNamespace(exp=SimpleNamespace(config=cfg)), batch=3, steps=2)  # type: ignore[arg-type]
    assert (sgd.lr, sgd.momentum, sgd.weight_decay, sgd.steps, sgd.dampening) == (0.07, 0.6, 0.003, 2, 0.0)
    assert (train.batch_size, train.local_steps) == (3, 2)
