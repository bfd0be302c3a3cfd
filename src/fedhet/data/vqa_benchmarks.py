"""FedDAT's four heterogeneity benchmarks (thesis ch. 3, Sec. "Benchmarks") built from easy-VQA, plus its source:
datasets `easy_vqa_domain` (style + question family per client), `easy_vqa_function` (family), `easy_vqa_scene`
(style), `easy_vqa_task` (disjoint answer pools: a client-specific head, low-shot) and `easy_vqa_source` (the
images no client uses, one domain per family, for central pretraining).

Splits are fixed by data seed `DATA_SEED` (the same for every experiment seed): clients get disjoint image
blocks, and questions spread evenly over their families, then answers. docs/easy_vqa.md "The benchmarks" gives
the rules. A sample is ((image float 3 x S x S, ImageNet-normalised; question LongTensor[16]), answer id).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torchvision.transforms import v2

from fedhet.data.easy_vqa import (
    ANSWERS,
    EASY_VQA_VOCAB,
    FAMILIES,
    SHAPES,
    SPLITS,
    Questions,
    load_questions,
    resized_images,
)
from fedhet.data.partition import allocate
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, Transform, register_dataset
from fedhet.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from fedhet.data.vqa_styles import render_style
from fedhet.errors import unknown_choice

if TYPE_CHECKING:
    from fedhet.config import DataConfig
    from fedhet.data.datasets import IndexedDataset

DATA_SEED = 2024
CLIENT_TRAIN_IMAGES = 1800  # of easy-VQA's 4,000 training images; the other 2,200 are the source's
SOURCE_TEST_FRACTION = 0.1  # of the source images, held out (by image) as its test split
DEFAULT_IMAGE_SIZE = 32


@dataclass(frozen=True)
class VQAClient:
    """One benchmark client: its image style, question families and (Task) answer pool."""

    name: str
    style: str
    families: tuple[str, ...]
    pool: tuple[str, ...] | None = None  # the answers it may take (None: every answer of its families)


@dataclass(frozen=True)
class VQABenchmark:
    """A benchmark: its clients, how many questions each gets (in total, or per answer of its pool), and what
    differs between its clients (the registry's description)."""

    name: str
    clients: tuple[VQAClient, ...]
    train_size: int
    test_size: int
    what: str
    per_answer: bool = False  # sizes count per answer of the pool (low-shot Task); else per client
    pools: bool = False  # ClientData.classes = the client's pool


YES_NO = ("yes", "no")
BRIGHT, DARK = ("blue", "green", "red", "yellow"), ("black", "brown", "gray", "teal")
BENCHMARKS = {b.name: b for b in (
    VQABenchmark("easy_vqa_domain", (
        VQAClient("clean_negated", "clean", ("negated",)),
        VQAClient("inverted_colour", "inverted", ("colour",)),
        VQAClient("blurred_shape", "blurred", ("shape",)),
        VQAClient("noisy_colour_yn", "noisy", ("colour_yn",)),
        VQAClient("recoloured_shape_yn", "recoloured", ("shape_yn",))), 256, 160,
        "FedDAT Domain benchmark: style + question family per client"),
    VQABenchmark("easy_vqa_function", tuple(VQAClient(f, "clean", (f,)) for f in FAMILIES), 256, 160,
                 "FedDAT Function benchmark: question family per client"),
    VQABenchmark("easy_vqa_scene", tuple(VQAClient(s, s, FAMILIES) for s in (
        "clean", "inverted", "blurred", "noisy", "recoloured", "pixelated")), 256, 160,
        "FedDAT Scene benchmark: image style per client"),
    VQABenchmark("easy_vqa_task", (
        VQAClient("yes_no", "clean", ("shape_yn", "colour_yn", "negated"), YES_NO),
        VQAClient("shape", "clean", ("shape",), SHAPES),
        VQAClient("colour_bright", "clean", ("colour",), BRIGHT),
        VQAClient("colour_dark", "clean", ("colour",), DARK)), 32, 40,
        "FedDAT Task benchmark: answer pool per client, low-shot", per_answer=True, pools=True),
)}


def benchmark(name: str) -> VQABenchmark:
    """The benchmark registered as dataset `name`; unknown names raise a ConfigError naming the nearest."""
    if name not in BENCHMARKS:
        raise unknown_choice("easy-VQA benchmark", name, BENCHMARKS)
    return BENCHMARKS[name]


@functools.lru_cache(maxsize=1)
def _permutations() -> tuple[np.ndarray, np.ndarray]:
    """The fixed permutations of easy-VQA's train and test image ids."""
    rng = np.random.default_rng(DATA_SEED)
    n_train, n_test = (int(load_questions(s).image.max()) + 1 for s in ("train", "test"))
    return rng.permutation(n_train), rng.permutation(n_test)


def image_blocks(num_clients: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(training image ids, test image ids) of each of `num_clients` clients: disjoint blocks."""
    train, test = _permutations()
    return np.array_split(train[:CLIENT_TRAIN_IMAGES], num_clients), np.array_split(test, num_clients)


def source_images() -> tuple[np.ndarray, np.ndarray]:
    """(train, test) image ids of the source portion: training images no benchmark client uses."""
    rest = _permutations()[0][CLIENT_TRAIN_IMAGES:]
    n_test = round(len(rest) * SOURCE_TEST_FRACTION)
    return rest[n_test:], rest[:n_test]


def _spread(keys: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """Positions of `n` entries, spread as evenly over the distinct values of `keys[0]` as their counts allow, then
    within each value over those of `keys[1]`, and so on."""
    values, counts = np.unique(keys[0], return_counts=True)
    chosen = []
    for v, k in zip(values, allocate(np.ones(len(values)), n, caps=counts), strict=True):
        rows = np.flatnonzero(keys[0] == v)
        inner = [key[rows] for key in keys[1:]]
        chosen.append(rows[_spread(inner, int(k), rng)] if inner else rng.choice(rows, k, replace=False))
    return np.concatenate(chosen or [np.zeros(0, np.int64)])


def select_questions(q: Questions, images: np.ndarray, client: VQAClient, size: int, per_answer: bool,
                     rng: np.random.Generator) -> np.ndarray:
    """Sorted question indices of `client` on `images`: its families (and pool), even over families then
    answers; `size` questions in all, or `size` per answer of the pool when `per_answer`."""
    pool = client.pool or ANSWERS
    ok = np.isin(q.image, images) & np.isin(q.family, [FAMILIES.index(f) for f in client.families])
    cand = np.flatnonzero(ok & np.isin(q.answer, [ANSWERS.index(a) for a in pool]))
    if per_answer:
        return np.sort(cand[_spread([q.answer[cand]], size * len(pool), rng)])
    return np.sort(cand[_spread([q.family[cand], q.answer[cand]], size, rng)])


def pack(q: Questions, idx: np.ndarray, images: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
    """uint8 rows: question i's image (row of `images` whose id in sorted `ids` is its image id; 3 x S x S,
    flattened) followed by its word ids."""
    rows = torch.from_numpy(np.searchsorted(ids, q.image[idx]))
    return torch.cat([images[rows].reshape(len(idx), -1), torch.from_numpy(q.tokens[idx])], dim=1)


def _split(q: Questions, idx: np.ndarray, images: torch.Tensor, style: str, seed: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows (images in `style`) and answer ids of questions `idx`; `images` indexed by image id."""
    ids = np.unique(q.image[idx])
    styled = render_style(style, images[torch.from_numpy(ids)], seed)
    return pack(q, idx, styled, ids), torch.from_numpy(q.answer[idx])


def client_questions(name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Client name -> (train, test) question indices into easy-VQA's train / test questions, for benchmark `name`."""
    b = benchmark(name)
    train_q, test_q = load_questions("train"), load_questions("test")
    blocks = image_blocks(len(b.clients))
    bi = list(BENCHMARKS).index(name)
    out = {}
    for k, client in enumerate(b.clients):
        rngs = [np.random.default_rng([DATA_SEED, bi, k, si]) for si in (0, 1)]
        out[client.name] = (select_questions(train_q, blocks[0][k], client, b.train_size, b.per_answer, rngs[0]),
                            select_questions(test_q, blocks[1][k], client, b.test_size, b.per_answer, rngs[1]))
    return out


def style_seed(name: str, client: int, split: str) -> int:
    """The seed of a client's random image style (noise, textures) on one split."""
    return DATA_SEED + 100 * list(BENCHMARKS).index(name) + 10 * client + SPLITS.index(split)


@functools.lru_cache(maxsize=8)
def build_benchmark(name: str, image_size: int) -> dict[str, DomainData]:
    """Client name -> DomainData (packed train / test rows, answer ids, the pool for Task) of benchmark `name`."""
    b = benchmark(name)
    images = resized_images(image_size)
    out = {}
    for k, (client, idx) in enumerate(zip(b.clients, client_questions(name).values(), strict=True)):
        (x, y), (xt, yt) = (_split(load_questions(s), i, images[s], client.style, style_seed(name, k, s))
                            for s, i in zip(SPLITS, idx, strict=True))
        pool = tuple(sorted(ANSWERS.index(a) for a in client.pool)) if b.pools and client.pool else None
        out[client.name] = DomainData(x, y, xt, yt, classes=pool, note=(
            f"easy-VQA {client.style} images, {'/'.join(client.families)} questions (data seed {DATA_SEED})"))
    return out


def source_questions(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of the source's questions on `images`: per family, every answer as often as its rarest
    (easy-VQA's yes/no families are 66-88% one answer; a model pretrained on them learns that prior)."""
    q = load_questions("train")
    cand = np.flatnonzero(np.isin(q.image, images))
    chosen = []
    for f in np.unique(q.family[cand]):
        sub = cand[q.family[cand] == f]
        values, counts = np.unique(q.answer[sub], return_counts=True)
        chosen += [rng.choice(sub[q.answer[sub] == v], counts.min(), replace=False) for v in values]
    return np.sort(np.concatenate(chosen))


@functools.lru_cache(maxsize=2)
def build_source(image_size: int) -> dict[str, DomainData]:
    """The source portion, one domain per question family: clean source images, answers balanced per family,
    split by image (the families share images)."""
    q = load_questions("train")
    images = resized_images(image_size)["train"]
    idx = [source_questions(ids, np.random.default_rng([DATA_SEED, 99, i])) for i, ids in enumerate(source_images())]
    out = {}
    for f, family in enumerate(FAMILIES):
        (x, y), (xt, yt) = (_split(q, i[q.family[i] == f], images, "clean", 0) for i in idx)
        out[family] = DomainData(x, y, xt, yt, note=f"easy-VQA source images, clean, {family} questions, "
                                                    f"answer-balanced (data seed {DATA_SEED})")
    return out


class VQAInputs:
    """A packed row -> (image float 3 x S x S, ImageNet-normalised [+ training noise], question LongTensor[16])."""

    def __init__(self, size: int, noise_std: float = 0.0) -> None:
        self.size, self.noise_std = size, noise_std
        self.normalize = v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)

    def __call__(self, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.size
        image = self.normalize(row[: 3 * s * s].view(3, s, s).float() / 255.0)
        if self.noise_std > 0:
            image = image + self.noise_std * torch.randn_like(image)
        return image, row[3 * s * s:].long()

    def __repr__(self) -> str:
        return f"VQAInputs(size={self.size}, noise_std={self.noise_std})"


def vqa_transforms(train: IndexedDataset, cfg: DataConfig, size: int) -> tuple[Transform, Transform]:
    """(train, eval) transforms: no augmentation (a crop could cut the shape out of an existence question);
    `data.input_noise_std` adds noise to training images."""
    return cast(Transform, VQAInputs(size, cfg.input_noise_std)), cast(Transform, VQAInputs(size))


def _load(name: str, ctx: LoadContext, domain: str) -> DomainData:
    if name == "easy_vqa_source":
        return build_source(ctx.image_size)[domain]
    return build_benchmark(name, ctx.image_size)[domain]


def _register(name: str, domains: tuple[str, ...], what: str) -> None:
    register_dataset(DatasetSpec(
        name=name, domains=domains, classes=ANSWERS, modality="vqa", vocabulary=tuple(EASY_VQA_VOCAB),
        loader=functools.partial(_load, name),
        source=f"easy-VQA (Zhou 2020, https://github.com/vzhou842/easy-VQA, PyPI easy-vqa); {what} (docs/easy_vqa.md)",
        layout="(built in: the package easy-vqa, pip install 'fedhet[vlm]'; decoded images cached)",
        default_image_size=DEFAULT_IMAGE_SIZE, hflip=False, builtin=True, transforms=vqa_transforms))


for _b in BENCHMARKS.values():
    _register(_b.name, tuple(c.name for c in _b.clients), _b.what)
_register("easy_vqa_source", FAMILIES, "the images no benchmark client uses, one domain per question family, for "
          "central pretraining")
