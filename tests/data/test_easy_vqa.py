"""easy-VQA and FedDAT's four heterogeneity benchmarks built from it (fedhet.data.easy_vqa, vqa_benchmarks)."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("easy_vqa")

from fedhet.cli import main  # noqa: E402
from fedhet.config import DataConfig  # noqa: E402
from fedhet.data import build_federated_data  # noqa: E402
from fedhet.data import easy_vqa as E  # noqa: E402
from fedhet.data import vqa_benchmarks as B  # noqa: E402
from fedhet.data.vqa_styles import STYLES, render_style  # noqa: E402
from fedhet.errors import ConfigError, DatasetNotFoundError  # noqa: E402

SIZE = 16  # a tiny image side keeps every build fast


def fed(name: str, seed: int = 0, **kw: object):  # noqa: ANN201
    return build_federated_data(DataConfig(dataset=name, image_size=SIZE, **kw), seed)  # type: ignore[arg-type]


def questions(ds) -> list[tuple[str, str]]:  # noqa: ANN001
    """(question text, answer) of every sample of a client split, read back from the samples."""
    return [(E.decode_question(x[1]), E.ANSWERS[int(y)]) for x, y in (ds[i] for i in range(len(ds)))]


def families(ds) -> Counter:  # noqa: ANN001
    return Counter(E.question_family(t, a) for t, a in questions(ds))


def test_sample_is_image_question_answer_and_batches_collate() -> None:
    data = fed("easy_vqa_function")
    assert data.modality == "vqa" and data.input_shape == (3, SIZE, SIZE) and data.num_classes == 13
    (image, question), answer = data.clients[0].train[0]
    assert image.dtype == torch.float32 and image.shape == (3, SIZE, SIZE)
    assert question.dtype == torch.int64 and question.shape == (E.QUESTION_LEN,)
    assert answer.dtype == torch.int64 and answer.ndim == 0
    assert image.min() < -1.0 and image.max() > 1.0  # ImageNet-normalised, not raw [0, 1] or [0, 255]
    x, y = next(iter(DataLoader(data.clients[0].train, batch_size=5)))
    assert [t.shape for t in x] == [(5, 3, SIZE, SIZE), (5, E.QUESTION_LEN)] and y.shape == (5,)


def test_vocabulary_and_answers_match_the_package() -> None:
    pkg = E.easy_vqa_package()
    texts = pkg.get_train_questions()[0] + pkg.get_test_questions()[0]
    words = sorted({w for t in texts for w in E.tokenize(t)})
    assert E.EASY_VQA_VOCAB == ("<pad>", "<unk>", *words) and len(E.EASY_VQA_VOCAB) <= E.VOCAB_SIZE
    assert E.ANSWERS == tuple(pkg.get_answers())
    for t in texts[:3000]:
        assert E.decode_question(E.encode_question(t)) == " ".join(E.tokenize(t))


def test_encode_question_pads_maps_unknown_words_and_refuses_long_questions() -> None:
    ids = E.encode_question("Is there a purple circle?")
    assert ids.tolist()[:5] == [E.WORD_IDS["is"], E.WORD_IDS["there"], E.WORD_IDS["a"], E.UNK, E.WORD_IDS["circle"]]
    assert ids.tolist()[5:] == [E.PAD] * 11 and ids.dtype == torch.int64
    with pytest.raises(ConfigError, match="more than QUESTION_LEN"):
        E.encode_question("a " * 17)


@pytest.mark.parametrize(("text", "answer", "family"), [
    ("what shape is present?", "circle", "shape"), ("what is the blue shape?", "rectangle", "shape"),
    ("what color is the triangle?", "red", "colour"), ("is there a circle in the image?", "no", "shape_yn"),
    ("is a red shape present?", "yes", "colour_yn"), ("is no red shape present?", "yes", "negated"),
    ("does the image not contain a circle?", "no", "negated")])
def test_question_family(text: str, answer: str, family: str) -> None:
    assert E.question_family(text, answer) == family


def test_function_each_client_asks_one_family_its_own() -> None:
    data = fed("easy_vqa_function")
    assert [c.name for c in data.clients] == list(E.FAMILIES)
    for c in data.clients:
        for split in (c.train, c.test):
            assert set(families(split)) == {c.name}
        assert c.classes is None


def test_scene_same_question_mix_different_styles() -> None:
    data = fed("easy_vqa_scene")
    mixes = [families(c.train) for c in data.clients]
    assert all(m == mixes[0] for m in mixes) and set(mixes[0]) == set(E.FAMILIES)
    assert sorted(c.name for c in data.clients) == sorted(STYLES)
    brightness = {c.name: float(np.mean([c.train[i][0][0].mean() for i in range(50)])) for c in data.clients}
    assert brightness["inverted"] < brightness["clean"] - 2.0  # dark backgrounds
    qs = B.client_questions("easy_vqa_scene")
    clean = B.build_benchmark("easy_vqa_scene", SIZE)["clean"].x_train
    inv = B.build_benchmark("easy_vqa_scene", SIZE)["inverted"].x_train
    q = E.load_questions("train")
    raw = E.resized_images(SIZE)["train"]
    for name, rows in (("clean", clean), ("inverted", inv)):  # pixels = the style applied to the client's images
        idx = qs[name][0]
        expect = render_style(name, raw[torch.from_numpy(q.image[idx])], 0).reshape(len(idx), -1)
        assert torch.equal(rows[:, : 3 * SIZE * SIZE], expect)


def test_domain_clients_differ_in_style_and_family() -> None:
    bench = B.benchmark("easy_vqa_domain")
    assert len({c.style for c in bench.clients}) == len(bench.clients)
    data = fed("easy_vqa_domain")
    fams = [set(families(c.train)) for c in data.clients]
    assert all(len(f) == 1 for f in fams) and len(set.union(*fams)) == len(data.clients)
    assert {c.name: c.style for c in bench.clients}["inverted_colour"] == "inverted"
    mean = {c.name: float(np.mean([c.train[i][0][0].mean() for i in range(50)])) for c in data.clients}
    assert mean["inverted_colour"] < mean["clean_negated"] - 1.0


def test_task_answers_lie_in_each_clients_disjoint_pool_low_shot() -> None:
    data = fed("easy_vqa_task")
    pools = [set(c.classes or ()) for c in data.clients]
    assert all(pools) and sum(len(p) for p in pools) == 13 and set.union(*pools) == set(range(13))
    for c, pool in zip(data.clients, pools, strict=True):
        for split in (c.train, c.test):
            assert set(split.labels.tolist()) == pool  # every answer of the pool occurs, nothing else
        assert max(Counter(c.train.labels.tolist()).values()) <= B.benchmark("easy_vqa_task").train_size
    out = data.describe()
    assert "classes of yes_no (its head's pool): yes, no" in out


def test_no_majority_answer_gives_a_free_score() -> None:
    for name in ("easy_vqa_domain", "easy_vqa_function"):
        for c in fed(name).clients:
            counts = np.bincount(c.test.labels, minlength=13)
            assert counts.max() / counts.sum() <= 0.65, (name, c.name)


def test_splits_are_fixed_disjoint_and_apart_from_the_source() -> None:
    q = {s: E.load_questions(s) for s in E.SPLITS}
    src_train, src_test = B.source_images()
    for name in B.BENCHMARKS:
        qs = B.client_questions(name)
        for si, split in enumerate(E.SPLITS):
            imgs = [set(q[split].image[v[si]].tolist()) for v in qs.values()]
            assert sum(len(i) for i in imgs) == len(set.union(*imgs)), f"{name}: clients share {split} images"
            if split == "train":
                assert not set.union(*imgs) & (set(src_train.tolist()) | set(src_test.tolist()))
    assert not set(src_train.tolist()) & set(src_test.tolist())
    a, b = fed("easy_vqa_task", seed=0), fed("easy_vqa_task", seed=7)  # the benchmark is the same for every seed
    for ca, cb in zip(a.clients, b.clients, strict=True):
        assert torch.equal(ca.train.raw_x(), cb.train.raw_x()) and np.array_equal(ca.test.labels, cb.test.labels)


def test_split_selection_is_deterministic_and_seeded() -> None:
    q = E.load_questions("train")
    client = B.benchmark("easy_vqa_scene").clients[0]
    images = B.image_blocks(6)[0][0]
    pick = [B.select_questions(q, images, client, 64, False, np.random.default_rng(s)) for s in (1, 1, 2)]
    assert np.array_equal(pick[0], pick[1]) and not np.array_equal(pick[0], pick[2])
    assert len(pick[0]) == 64 and Counter(q.family[pick[0]].tolist()) == Counter({f: 13 - (f > 3) for f in range(5)})


def test_training_noise_only_on_training_images() -> None:
    data = fed("easy_vqa_function", input_noise_std=0.5)
    c = data.clients[0]
    assert not torch.equal(c.train[0][0][0], c.train_eval[0][0][0])
    assert torch.equal(c.test[0][0][0], c.test[0][0][0]) and torch.equal(c.train[0][0][1], c.train_eval[0][0][1])


def test_data_show_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "show", "data.dataset=easy_vqa_task", f"data.image_size={SIZE}"]) == 0
    out = capsys.readouterr().out
    assert "easy_vqa_task: 4 clients, 13 classes, input (3, 16, 16)" in out and "colour_dark" in out


def test_unknown_benchmark_names_the_nearest() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'easy_vqa_domain'.*easy_vqa_function"):
        B.benchmark("easy_vqa_domian")
    with pytest.raises(ConfigError, match="did you mean 'easy_vqa_scene'"):
        fed("easy_vqa_scen")
    with pytest.raises(ConfigError, match="unknown easy-VQA image style 'noise'.*did you mean 'noisy'"):
        render_style("noise", torch.zeros(1, 3, 8, 8, dtype=torch.uint8), 0)


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "easy_vqa", None)
    with pytest.raises(DatasetNotFoundError, match=r"pip install 'fedhet\[vlm\]'"):
        E.easy_vqa_package()


def test_image_cache_is_written_and_a_damaged_one_rebuilt(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path))
    E.native_images.cache_clear()
    try:
        first = E.native_images()
        path = tmp_path / "easy_vqa" / "images_64.npz"
        assert path.is_file() and first["train"].shape == (4000, 3, 64, 64) and first["test"].shape[0] == 1000
        path.write_bytes(b"not a zip")
        E.native_images.cache_clear()
        again = E.native_images()
        assert np.array_equal(again["test"], first["test"]) and path.stat().st_size > 1000
    finally:
        E.native_images.cache_clear()


def test_source_is_answer_balanced_per_family_and_split_by_image() -> None:
    q = E.load_questions("train")
    src_train, src_test = B.source_images()
    idx = B.source_questions(src_train, np.random.default_rng(0))
    assert set(q.image[idx].tolist()) <= set(src_train.tolist())
    for f in range(len(E.FAMILIES)):
        counts = Counter(q.answer[idx][q.family[idx] == f].tolist())
        assert len(set(counts.values())) == 1, (E.FAMILIES[f], counts)  # every answer as often as the rarest
    data = fed("easy_vqa_source")
    assert [c.name for c in data.clients] == list(E.FAMILIES) and len(data.pooled_test()) > 500  # type: ignore[arg-type]
    for c in data.clients:
        assert set(families(c.test)) == {c.name}
