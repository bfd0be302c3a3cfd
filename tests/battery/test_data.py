"""Bad dataset files and `data show` outputs: one clear error naming the file, nothing written."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _digits(n: int = 40) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.integers(0, 255, (n, 28, 28), dtype=np.uint8), "y": np.arange(n) % 10}


GOOD = _npz(**_digits())
BAD_NPZ = {  # name: (content, words)
    "truncated_half": (GOOD[: len(GOOD) // 2], ("truncated or corrupt",)),
    "truncated_tail": (GOOD[:-10], ("truncated or corrupt",)),
    "zero_bytes": (b"", ("truncated or corrupt",)),
    "not_an_npz": (b"<html>404 Not Found</html>" * 4, ("not a NumPy .npz archive",)),
    "corrupt_middle": (GOOD[:300] + bytes(200) + GOOD[500:], ("truncated or corrupt",)),
    "missing_labels": (_npz(x=_digits()["x"]), ("lacks the array 'y'",)),
}


@pytest.mark.parametrize("name", list(BAD_NPZ))
@pytest.mark.parametrize("command", ["run", "data"])
def test_bad_digits_npz_names_the_file(battery, name: str, command: str) -> None:
    content, words = BAD_NPZ[name]
    npz = battery.write("data/digits/mnist.npz", content)
    battery.finished_run()
    argv = ["run", "--quiet", *battery.tiny] if command == "run" else ["data", "show", *battery.tiny]
    argv += ["data.dataset=digits", "data.domains=[mnist]", f"data.root={battery.root / 'data'}"]
    argv = [a for a in argv if not a.startswith("data.dataset=offline")]
    battery.fails(argv, f"dataset file '{npz}'", *words, "download the dataset again", code=2)


def test_good_digits_npz_loads(battery) -> None:
    """The control for the cases above: the same layout with an intact file works."""
    battery.write("data/digits/mnist.npz", GOOD)
    result = battery.succeeds(["data", "show", "data.dataset=digits", "data.domains=[mnist]",
                               f"data.root={battery.root / 'data'}"])
    assert "mnist" in result.out


def test_truncated_surf_npz_names_the_file(battery) -> None:
    rng = np.random.default_rng(0)
    good = _npz(x=rng.random((20, 800)).astype(np.float32), y=np.arange(20) % 10)
    npz = battery.write("data/office_caltech10_surf/amazon.npz", good[: len(good) // 3])
    battery.fails(["data", "show", "data.dataset=office_caltech10_surf", "data.domains=[amazon]",
                   f"data.root={battery.root / 'data'}"], f"'{npz}'", "truncated or corrupt")


PLOTS = {  # name: (--plot value relative to root, words)
    "existing_text_file": ("notes.txt", ("'.txt' is not an image format", ".png")),
    "existing_config": ("tiny.yaml", ("'.yaml' is not an image format",)),
    "no_extension": ("partition", ("no image extension", ".png")),
    "folder": ("plots", ("is a folder", "partition.png")),
    "parent_is_a_file": ("notes.txt/partition.png", ("'notes.txt' is a file, not a folder",)),
}


@pytest.mark.parametrize("name", list(PLOTS))
def test_bad_plot_path(battery, name: str) -> None:
    value, words = PLOTS[name]
    battery.write("notes.txt", "keep me\n")
    battery.tiny_config()
    (battery.root / "plots").mkdir()
    battery.watch(battery.root / "plots")
    battery.fails(["data", "show", *battery.tiny, "--plot", value], "--plot", *words, code=2)
    assert not list(battery.root.glob("*.png"))


def test_plot_in_a_folder_without_permission(battery, monkeypatch) -> None:
    import fedhet.outpaths

    real_access = fedhet.outpaths.os.access
    locked = battery.root / "locked"
    monkeypatch.setattr(fedhet.outpaths.os, "access",  # chmod does not stop root: pretend
                        lambda path, mode: Path(path).resolve() != locked and real_access(path, mode))
    locked.mkdir()
    battery.fails(["data", "show", *battery.tiny, "--plot", "locked/p.png"], "cannot write in", "permission denied")


def test_plot_write_failure_is_one_line(battery, monkeypatch) -> None:
    import matplotlib.figure

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", "p.png")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    battery.fails(["data", "show", *battery.tiny, "--plot", "p.png"], "cannot write --plot", "No space left")


def test_plot_over_an_existing_png_is_allowed(battery) -> None:
    battery.write("p.png", b"old", watch=False)
    result = battery.succeeds(["data", "show", *battery.tiny, "--plot", "p.png"])
    assert "plot: p.png" in result.out and (battery.root / "p.png").read_bytes()[:4] == b"\x89PNG"
