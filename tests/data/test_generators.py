"""The built-in offline_digits benchmark and the SynthDigits generator."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from fedhet.data import offline_digits as od
from fedhet.data.registry import LoadContext
from fedhet.data.synth_digits import find_fonts, render_digit


def test_offline_digits_domains_disjoint_and_balanced() -> None:
    parts = od.domain_indices()
    cat = np.concatenate(parts)
    assert len(cat) == 1797 and len(np.unique(cat)) == 1797
    _, y = od._raw_digits()
    for p in parts:
        assert np.bincount(y[p], minlength=10).min() >= 43


def test_offline_digits_deterministic() -> None:
    a = od.render("colored", od._raw_digits()[0][:50], seed=3)
    b = od.render("colored", od._raw_digits()[0][:50], seed=3)
    assert a.dtype == torch.uint8 and a.shape == (50, 3, 28, 28) and torch.equal(a, b)


@pytest.mark.slow  # a wall-clock bound: meaningful on an otherwise idle machine only, so not in the default suite
def test_offline_digits_render_fast() -> None:
    t = time.perf_counter()
    od.render("colored", od._raw_digits()[0][:50], seed=3)
    assert time.perf_counter() - t < 1.0


def test_offline_digits_domains_differ() -> None:
    stats = {}
    for dom in od.DOMAINS:
        d = od.load_offline_digits_domain(LoadContext(None, 28), dom)
        x = d.x_train.float() / 255
        stats[dom] = (x.mean().item(), x.std().item(), (x[:, 0] - x[:, 2]).abs().mean().item())
    assert stats["inverted"][0] > stats["clean"][0] + 0.4  # light background
    assert stats["colored"][2] > 0.1 and stats["clean"][2] == 0  # colour vs grey
    assert stats["thick_blur"][0] > stats["clean"][0] + 0.05  # thicker, noisy strokes
    means = sorted(s[0] for s in stats.values())
    assert min(b - a for a, b in zip(means, means[1:], strict=False)) > 0.03


def test_synth_digit_render_deterministic() -> None:
    fonts = find_fonts()
    a = [render_digit(d, np.random.default_rng(7 + d), fonts) for d in range(3)]
    b = [render_digit(d, np.random.default_rng(7 + d), fonts) for d in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert a[0].shape == (32, 32, 3) and a[0].dtype == np.uint8 and a[0].std() > 5
    c = render_digit(0, np.random.default_rng(8), fonts)
    assert not np.array_equal(a[0], c)


def test_synth_digits_generator_labels() -> None:
    from fedhet.data.synth_digits import generate_synth_digits

    x, y = generate_synth_digits(30, seed=5)
    x2, y2 = generate_synth_digits.__wrapped__(30, 5)
    assert x.shape == (30, 32, 32, 3) and np.bincount(y).tolist() == [3] * 10
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
