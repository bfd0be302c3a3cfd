"""Novel clients (AdaptFED Sec. 4.2.6): held-out clients never train, then adapt only the chosen part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedhet.config import NovelConfig, load_config
from fedhet.engine.experiment import build_experiment
from fedhet.engine.novel import epochs_to_reach, held_out, train_novel
from fedhet.errors import ConfigError, FedhetError
from fedhet.launch.adapt import adapt_run
from fedhet.launch.run import run_experiment

NAMES = [f"c{i}" for i in range(10)]
FOCAL = ["model.name=focalnet", "model.args={embed_dim: 8, depths: [2], patch_size: 4}"]
BASE = ["data.dataset=offline_digits", "data.fraction=0.3", "train.local_steps=2", "train.batch_size=16",
        "run.num_threads=1", "run.quiet=true", "rounds=2", "novel.epochs=2", "data.clients_per_domain=2"]


def test_held_out_by_share_or_name() -> None:
    ids = held_out(NovelConfig(holdout=0.3), NAMES, seed=1)
    assert len(ids) == 3 and ids == sorted(ids) and ids == held_out(NovelConfig(holdout=0.3), NAMES, seed=1)
    assert ids != held_out(NovelConfig(holdout=0.3), NAMES, seed=2)
    assert held_out(NovelConfig(clients=["c7", "c2"]), NAMES, 0) == [2, 7]
    assert held_out(NovelConfig(), NAMES, 0) == []
    with pytest.raises(ConfigError, match="unknown clients"):
        held_out(NovelConfig(clients=["nope"]), NAMES, 0)
    with pytest.raises(ConfigError, match="none would train"):
        held_out(NovelConfig(clients=NAMES), NAMES, 0)
    with pytest.raises(ConfigError):
        NovelConfig(holdout=1.0).validate()
    assert epochs_to_reach([0.2, 0.5, 0.79, 0.8, 0.6], 0.98) == 2


def test_held_out_clients_are_never_sampled_nor_averaged(tmp_path: Path) -> None:
    cfg = load_config(None, [*BASE, "method=fedavg", "novel.holdout=0.25", "server.fraction_fit=0.5", "rounds=3",
                             "eval.pooled_test=true"])
    exp = build_experiment(cfg)
    novel = set(exp.arrangement.novel)
    assert len(novel) == 2 and exp.arrangement.pool(8) == [c for c in range(8) if c not in novel]
    result = run_experiment(cfg, tmp_path / "run", progress=False)
    names = {exp.data.clients[c].name for c in novel}
    assert not names & set(result.final)  # training-time averages leave them out
    assert {r["client"] for r in result.summary["novel"]["clients"]} == names
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    pooled = [r["num_examples"] for r in rows if r["client"] == "pooled"]
    assert pooled and set(pooled) == {sum(len(c.test) for i, c in enumerate(exp.data.clients) if i not in novel)}


def _alg_server(extra: list[str]):
    exp = build_experiment(load_config(None, [*BASE, *FOCAL, "method=adaptfed", "novel.holdout=0.25", *extra]))
    return exp, exp.algorithm, exp.init_server()


@pytest.mark.parametrize("part, extra", [("embedding", []), ("hypernetwork", []),
                                         ("embedding", ["method_args.descriptor=label_histogram"]),
                                         ("embedding", ["method_args.local_head=true"])])
def test_adaptfed_novel_client_changes_only_its_part(part: str, extra: list[str]) -> None:
    pytest.importorskip("timm")
    exp, alg, server = _alg_server([f"novel.part={part}", *extra])
    cid, trained = exp.arrangement.novel[0], exp.arrangement.pool(len(exp.data.clients))
    novel = alg.novel_model(server, exp.context(cid, 1), part, trained)
    hnet = alg.hypernet(server)
    assert torch.allclose(novel.module.z, hnet.embeddings.weight[trained].mean(0))  # starts at the mean z
    before = {n: p.detach().clone() for n, p in novel.module.named_parameters()}
    accuracies = train_novel(exp, novel, cid, exp.config.novel)
    assert len(accuracies) == 3
    changed = {n for n, p in novel.module.named_parameters() if not torch.equal(p, before[n])}
    head = {n for n in changed if n.startswith("model.head.")}  # +FedPER: the site trains its own head
    assert bool(head) == ("method_args.local_head=true" in extra)
    assert "z" in changed and not any(n.startswith("model.") for n in changed - head)  # xi-bar never moves
    assert any(n.startswith("hnet.") for n in changed) == (part == "hypernetwork")
    assert not any(n.startswith("hnet.embeddings") for n in changed)  # the trained clients' z stay as they are


def test_adapt_command_adds_a_part_and_refuses_other_changes(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("timm")
    cfg = load_config(None, [*BASE, *FOCAL, "method=adaptfed", "novel.holdout=0.25"])
    run_experiment(cfg, tmp_path / "run", progress=False)
    assert set(json.loads((tmp_path / "run" / "novel.json").read_text())) == {"embedding"}
    adapt_run(tmp_path / "run", ["novel.part=hypernetwork", "novel.epochs=1"], progress=False)
    saved = json.loads((tmp_path / "run" / "novel.json").read_text())
    assert set(saved) == {"embedding", "hypernetwork"} and len(saved["hypernetwork"]["mean_accuracy"]) == 2
    with pytest.raises(FedhetError, match="changes only the adaptation"):
        adapt_run(tmp_path / "run", ["train.lr=0.1"])
    from fedhet.cli import main

    assert main(["adapt", str(tmp_path / "run"), "novel.part=embedding", "novel.epochs=1", "novel.lr=0.5", "-q"]) == 0
    assert "adapting 'embedding' for 1 epochs" in capsys.readouterr().out
    saved = json.loads((tmp_path / "run" / "novel.json").read_text())  # another lr is another entry
    assert set(saved) == {"embedding", "hypernetwork", "embedding@lr=0.5"} and saved["embedding@lr=0.5"]["lr"] == 0.5
    assert main(["adapt", str(tmp_path / "run"), "rounds=3"]) == 2  # one clear error, no traceback
    with pytest.raises(FedhetError, match="not a fedhet run directory"):
        adapt_run(tmp_path, [])


def test_report_has_a_novel_clients_section(tmp_path: Path) -> None:
    from fedhet.report import write_report

    cfg = load_config(None, [*BASE, "method=fedavg", "novel.holdout=0.25"])
    run_experiment(cfg, tmp_path / "run", progress=False)
    text = write_report([tmp_path / "run"], tmp_path / "report").markdown.read_text()
    section = text[text.index("## Novel clients"):]
    saved = json.loads((tmp_path / "run" / "novel.json").read_text())["all"]
    assert f"| all | {saved['clients'][0]['trainable_params'] / 1e3:.1f}k |" in section
    assert f"{100 * saved['mean_final']:.2f}" in section
