"""easy-VQA (the PyPI package `easy-vqa`, Zhou 2020): questions, word vocabulary, answers and decoded images.

The package ships 4,000 train / 1,000 test 64x64 PNG images, each with one shape (circle, rectangle,
triangle) of one of 8 colours on a light background, and 38,575 / 9,673 templated questions with 13 answers.
A question is encoded as `QUESTION_LEN` word ids over `EASY_VQA_VOCAB` (PAD = 0, UNK = 1, then the 26 words of
easy-VQA's questions, sorted); the answer ids follow `easy_vqa.get_answers()` (`ANSWERS`).

The question tuples carry no type field, so each question is put in a *family* by its template:
`shape` ("what shape is present?"), `colour` ("what color is the triangle?"), `shape_yn` ("is there a
circle?"), `colour_yn` ("is there a red shape?") and `negated` (yes/no with "not" / "no": "is no red shape
present?"). Decoded images are cached as `<cache>/easy_vqa/images_64.npz` (written atomically; `$FEDHET_CACHE`,
else `$XDG_CACHE_HOME/fedhet`, else `~/.cache/fedhet`), so PNGs are decoded once per machine.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from fedhet.atomic import atomic_write
from fedhet.cache import cache_root
from fedhet.errors import ConfigError, DatasetNotFoundError

log = logging.getLogger(__name__)

QUESTION_LEN = 16  # word ids per question, right-padded with PAD
VOCAB_SIZE = 64  # the most entries a VQA vocabulary may have (models size their embedding by it)
PAD, UNK = 0, 1
WORDS = ("a", "black", "blue", "brown", "circle", "color", "contain", "does", "gray", "green", "image", "in", "is",
         "no", "not", "of", "present", "rectangle", "red", "shape", "teal", "the", "there", "triangle", "what",
         "yellow")  # every word of easy-VQA's questions, sorted (a test checks this against the package)
EASY_VQA_VOCAB = ("<pad>", "<unk>", *WORDS)
WORD_IDS = {w: i for i, w in enumerate(EASY_VQA_VOCAB)}
ANSWERS = ("circle", "green", "red", "gray", "yes", "teal", "black", "rectangle", "yellow", "triangle", "brown",
           "blue", "no")  # easy_vqa.get_answers() order: answer id = index
SHAPES = ("circle", "rectangle", "triangle")
COLOURS = ("black", "blue", "brown", "gray", "green", "red", "teal", "yellow")
FAMILIES = ("shape", "colour", "shape_yn", "colour_yn", "negated")
NATIVE_SIZE = 64
SPLITS = ("train", "test")
INSTALL_HINT = "pip install 'fedhet[vlm]' (or pip install easy-vqa)"


def easy_vqa_package() -> ModuleType:
    """The installed `easy_vqa` package, or a DatasetNotFoundError saying how to install it."""
    try:
        return importlib.import_module("easy_vqa")  # Any: it ships no types
    except ImportError as err:
        raise DatasetNotFoundError(f"the easy-VQA benchmarks need the package 'easy-vqa': {INSTALL_HINT}") from err


def tokenize(text: str) -> list[str]:
    """The lower-case words of `text` (punctuation dropped)."""
    return re.findall(r"[a-z]+", text.lower())


def _word_ids(text: str) -> list[int]:
    words = tokenize(text)
    if len(words) > QUESTION_LEN:
        raise ConfigError(f"question has {len(words)} words, more than QUESTION_LEN = {QUESTION_LEN}: {text!r}")
    return [WORD_IDS.get(w, UNK) for w in words] + [PAD] * (QUESTION_LEN - len(words))


def encode_question(text: str) -> torch.Tensor:
    """`text` as a LongTensor of QUESTION_LEN word ids (unknown words UNK, right-padded with PAD)."""
    return torch.tensor(_word_ids(text), dtype=torch.int64)


def decode_question(ids: torch.Tensor | list[int]) -> str:
    """The words of encoded question `ids`, space-separated (PAD dropped)."""
    return " ".join(EASY_VQA_VOCAB[int(i)] for i in ids if int(i) != PAD)


def question_family(text: str, answer: str) -> str:
    """The family (one of FAMILIES) of an easy-VQA question, read from its template and answer."""
    words = set(tokenize(text))
    if answer in ("yes", "no"):
        if words & {"not", "no"}:
            return "negated"
        return "shape_yn" if words & set(SHAPES) else "colour_yn"
    return "shape" if answer in SHAPES else "colour"


@dataclass(frozen=True)
class Questions:
    """One split's questions as arrays: image id, answer id, family id (into FAMILIES), word ids (N x 16)."""

    image: np.ndarray
    answer: np.ndarray
    family: np.ndarray
    tokens: np.ndarray  # uint8: every id < VOCAB_SIZE

    def __len__(self) -> int:
        return len(self.image)


@functools.lru_cache(maxsize=2)
def load_questions(split: str) -> Questions:
    """The questions of split 'train' or 'test' as `Questions` (cached per process)."""
    pkg = easy_vqa_package()
    texts, answers, images = pkg.get_train_questions() if split == "train" else pkg.get_test_questions()
    tokens = np.asarray([_word_ids(t) for t in texts], np.uint8)
    family = [FAMILIES.index(question_family(t, a)) for t, a in zip(texts, answers, strict=True)]
    return Questions(np.asarray(images, np.int64), np.asarray([ANSWERS.index(a) for a in answers], np.int64),
                     np.asarray(family, np.int64), tokens)


def cache_dir() -> Path:
    """Where decoded easy-VQA images are cached: $FEDHET_CACHE, else $XDG_CACHE_HOME/fedhet, else ~/.cache/fedhet."""
    return cache_root() / "easy_vqa"


def _version() -> str:
    try:
        return f"easy-vqa {importlib.metadata.version('easy-vqa')}"
    except importlib.metadata.PackageNotFoundError:
        return "easy-vqa (unknown version)"


def _decode(split: str) -> np.ndarray:
    """All images of `split` decoded from the package's PNGs: uint8 N x 3 x 64 x 64, row i = image id i."""
    from PIL import Image

    pkg = easy_vqa_package()
    paths = pkg.get_train_image_paths() if split == "train" else pkg.get_test_image_paths()
    if sorted(paths) != list(range(len(paths))):
        raise DatasetNotFoundError(f"easy-VQA {split} image ids are not 0..{len(paths) - 1}; reinstall: {INSTALL_HINT}")
    out = np.empty((len(paths), 3, NATIVE_SIZE, NATIVE_SIZE), np.uint8)
    for i in range(len(paths)):
        with Image.open(paths[i]) as im:
            out[i] = np.asarray(im.convert("RGB").resize((NATIVE_SIZE, NATIVE_SIZE))).transpose(2, 0, 1)
    return out


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays when `path` holds a complete cache of this package version, else None."""
    try:
        with np.load(path) as z:
            if str(z["version"]) != _version():
                return None
            return {s: z[s] for s in SPLITS}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        log.warning("easy-VQA image cache %s unreadable (%s); decoding the PNGs again", path, err)
        return None


@functools.lru_cache(maxsize=1)
def native_images() -> dict[str, np.ndarray]:
    """{'train', 'test'} -> uint8 N x 3 x 64 x 64 images (row = image id), from the cache or decoded and cached."""
    path = cache_dir() / f"images_{NATIVE_SIZE}.npz"
    cached = _read_cache(path)
    if cached is not None:
        return cached
    images = {s: _decode(s) for s in SPLITS}

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, version=np.asarray(_version()), train=images["train"], test=images["test"])

    try:
        atomic_write(path, write)
    except OSError as err:
        log.warning("could not write the easy-VQA image cache %s (%s); decoding again next run", path, err)
    return images


@functools.lru_cache(maxsize=4)
def resized_images(size: int) -> dict[str, torch.Tensor]:
    """{'train', 'test'} -> uint8 N x 3 x size x size (bilinear with antialiasing from 64x64)."""
    out = {}
    for split, x in native_images().items():
        t = torch.from_numpy(x)
        if size != NATIVE_SIZE:
            t = torch.nn.functional.interpolate(t.float(), size=(size, size), mode="bilinear", antialias=True,
                                                align_corners=False).round().clamp(0, 255).to(torch.uint8)
        out[split] = t
    return out
