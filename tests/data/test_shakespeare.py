"""Dataset `shakespeare`: one client per speaking role, 80-character (here: short) windows -> the next character,
split in time order with LEAF's gap; min_samples / max_clients / the sample cap; the missing-file error; a
2-round AdaptFED run on the causal focal-modulation model through the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedhet.config import DataConfig, load_config
from fedhet.data import ClientData, FederatedData, build_federated_data
from fedhet.data.shakespeare import TOKENS, UNK_ID, encode, parse_roles
from fedhet.errors import ConfigError, DatasetNotFoundError

TEXT = """First Citizen:
Before we proceed any further,
hear me speak.

BOB:
No.

First Citizen:
You are all resolved rather to die?

CAROL:
Speak, speak; we know't, we know't.
Let us kill him, and we'll have corn.

EMPTY:

CAROL:
Is't a verdict\u00e9?
"""
ROLE_TEXT = {
    "First_Citizen": "Before we proceed any further, hear me speak. You are all resolved rather to die?",
    "BOB": "No.",
    "CAROL": "Speak, speak; we know't, we know't. Let us kill him, and we'll have corn. Is't a verdict\u00e9?",
}


def write_root(tmp_path: Path, text: str = TEXT) -> Path:
    (tmp_path / "tiny_shakespeare").mkdir()
    (tmp_path / "tiny_shakespeare" / "input.txt").write_text(text, encoding="utf-8")
    return tmp_path


def decode(ids: torch.Tensor) -> str:
    return "".join(TOKENS[int(i)] for i in ids)


def n_test(client: ClientData) -> int:
    return len(client.test)  # type: ignore[arg-type]


def build(root: Path, **options: object) -> FederatedData:
    return build_federated_data(DataConfig(dataset="shakespeare", root=str(root), options=dict(options)), seed=0)


def test_roles_are_speakers_with_their_lines_joined() -> None:
    assert parse_roles(TEXT) == ROLE_TEXT  # speeches joined, newlines -> spaces, an empty speech adds nothing


def test_clients_are_roles_and_windows_predict_the_next_character(tmp_path: Path) -> None:
    fed = build(write_root(tmp_path), seq_len=8, min_samples=5)
    assert [c.name for c in fed.clients] == ["CAROL", "First_Citizen"]  # BOB has < 5 windows; largest first
    assert fed.input_shape == (8,) and fed.num_classes == 101 == len(fed.vocabulary) and fed.modality == "text"
    for client in fed.clients:
        text = ROLE_TEXT[client.name]
        n = len(text) - 8
        n_train = int(0.8 * n)
        starts = list(range(n_train)) + list(range(n_train + 7, n))  # LEAF: test after the training text
        assert client.num_train == n_train and n_test(client) == n - n_train - 7
        samples = [client.train[i] for i in range(client.num_train)] + [client.test[i] for i in range(n_test(client))]
        for k, (x, y) in zip(starts, samples, strict=True):
            assert x.dtype == torch.int64 and x.shape == (8,)
            assert decode(x) == text[k:k + 8].replace("\u00e9", "<unk>")
            assert TOKENS[int(y)] == (text[k + 8] if text[k + 8] != "\u00e9" else "<unk>")


def test_split_is_in_time_order_and_the_gap_is_a_switch(tmp_path: Path) -> None:
    root = write_root(tmp_path)
    gap, no_gap = build(root, seq_len=8, min_samples=5), build(root, seq_len=8, min_samples=5, leaf_gap=False)
    carol, carol2 = gap.clients[0], no_gap.clients[0]
    text = ROLE_TEXT["CAROL"]
    last_train = decode(carol.train[carol.num_train - 1][0])
    first_test = decode(carol.test[0][0])
    assert text.index(last_train) + 8 <= text.index(first_test)  # no test input overlaps a training input
    assert n_test(carol2) == n_test(carol) + 7
    assert decode(carol2.test[0][0]) == text[carol2.num_train:carol2.num_train + 8]


def test_min_samples_max_clients_and_sample_cap(tmp_path: Path) -> None:
    root = write_root(tmp_path)
    assert [c.name for c in build(root, seq_len=1, min_samples=1).clients] == ["CAROL", "First_Citizen", "BOB"]
    assert [c.name for c in build(root, seq_len=8, min_samples=75).clients] == ["CAROL"]  # 87 vs 73 windows
    assert [c.name for c in build(root, seq_len=8, min_samples=5, max_clients=1).clients] == ["CAROL"]
    picks = [build(root, seq_len=1, min_samples=1, max_clients=1, client_selection="random",
                   selection_seed=s).clients[0].name for s in range(6)]
    assert len(set(picks)) > 1  # a seeded sample, not the largest role every time
    capped = build(root, seq_len=8, min_samples=5, max_samples_per_client=10).clients[0]
    assert (capped.num_train, n_test(capped)) == (8, 2)
    firsts = [ROLE_TEXT["CAROL"].index(decode(capped.train[i][0])) for i in range(8)]
    assert firsts == sorted(firsts) and firsts[-1] > 40  # evenly spaced over the training span, in order
    with pytest.raises(ConfigError, match="min_samples"):
        build(root, seq_len=8, min_samples=1000)
    with pytest.raises(ConfigError, match="client_selection"):
        build(root, client_selection="biggest")


def test_unknown_characters_share_one_id() -> None:
    assert encode("a\u00e9\u4e2d~").tolist() == [TOKENS.index("a"), UNK_ID, UNK_ID, TOKENS.index("~")]


def test_missing_file_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"(?s)tiny_shakespeare/input\.txt.*FEDHET_DATA"):
        build(tmp_path)


def test_two_rounds_of_adaptfed_on_the_focal_sequence_model(tmp_path: Path) -> None:
    from fedhet.launch.run import run_experiment

    (tmp_path / "data").mkdir()
    root = write_root(tmp_path / "data")
    cfg = load_config(None, [
        "method=adaptfed", "data.dataset=shakespeare", f"data.root={root}",
        "data.options={seq_len: 8, min_samples: 5}", "model.name=focal_sequence",
        "model.args={embed_dim: 8, depth: 1}", "rounds=2", "train.local_steps=3", "train.batch_size=8", "train.lr=0.1",
        "run.num_threads=1", "run.quiet=true", "eval.every=1"])
    result = run_experiment(cfg, tmp_path / "run", progress=False)
    assert result.rounds_completed == 2 and set(result.final) == {"CAROL", "First_Citizen", "avg"}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    loss = {r["round"]: r["loss"] for r in rows if r["client"] == "avg"}
    assert loss[2] < loss[1]  # the integer windows reach the model and it learns
