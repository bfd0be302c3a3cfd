"""Tiny generated data in the `imagefolder` and `csv` layouts, for the example configs and tests.

    python -m fedhet.data.examples imagefolder data/example_imagefolder
    python -m fedhet.data.examples csv data/example_hospitals.csv

Images: three classes (circle, square, triangle) drawn at a random place and size in three domains, `plain`
(white on black), `inverted` (dark grey on light grey) and `textured` (coloured on a noise texture, written in
the split layout `textured/{train,test}/<class>/`). Table: three hospitals with shifted age / blood-pressure
distributions, a categorical `smoker` column and a binary label from a fixed logistic rule.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle")
HOSPITALS = {"north": (55.0, 130.0), "south": (62.0, 145.0), "east": (48.0, 120.0)}  # mean age, blood pressure


def shape_image(shape: str, size: int, rng: np.random.Generator, fg: tuple[int, ...], bg: np.ndarray) -> Image.Image:
    """One `shape` in colour `fg` over background array `bg` (size x size x 3)."""
    img = Image.fromarray(bg.astype(np.uint8))
    r = rng.uniform(0.2, 0.35) * size
    cx, cy = rng.uniform(r, size - r, 2)
    draw = ImageDraw.Draw(img)
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fg)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fg)
    return img


def _style(domain: str, size: int, rng: np.random.Generator) -> tuple[tuple[int, ...], np.ndarray]:
    if domain == "plain":
        return (255, 255, 255), np.zeros((size, size, 3))
    if domain == "inverted":
        return (70, 70, 70), np.full((size, size, 3), 200.0)
    fg = tuple(int(v) for v in rng.integers(0, 256, 3))
    return fg, rng.integers(0, 256, (size, size, 3)).astype(np.float64)


def write_example_imagefolder(root: str | Path, per_class: int = 24, size: int = 32, seed: int = 0) -> Path:
    """Write the three-domain shapes dataset under `root`; returns `root`."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for domain in ("plain", "inverted", "textured"):
        for label in SHAPES:
            for i in range(per_class):
                split = ("train" if i < per_class * 3 // 4 else "test") if domain == "textured" else ""
                folder = root / domain / split / label
                folder.mkdir(parents=True, exist_ok=True)
                fg, bg = _style(domain, size, rng)
                shape_image(label, size, rng, fg, bg).save(folder / f"{i:03d}.png")
    return root


def write_example_csv(path: str | Path, rows_per_hospital: int = 120, seed: int = 0) -> Path:
    """Write the three-hospital table (columns hospital, age, blood_pressure, smoker, label) to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = ["hospital,age,blood_pressure,smoker,label"]
    for name, (age_mean, bp_mean) in HOSPITALS.items():
        age = rng.normal(age_mean, 9.0, rows_per_hospital)
        bp = rng.normal(bp_mean, 15.0, rows_per_hospital)
        smoker = rng.random(rows_per_hospital) < 0.3
        logit = 0.08 * (age - 55) + 0.04 * (bp - 132) + 1.2 * smoker + rng.normal(0, 0.5, rows_per_hospital)
        for a, b, s, y in zip(age, bp, smoker, logit > 0, strict=True):
            lines.append(f"{name},{a:.0f},{b:.0f},{'yes' if s else 'no'},{int(y)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedhet.data.examples", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["imagefolder", "csv"])
    parser.add_argument("path", help="folder (imagefolder) or .csv file (csv) to write")
    args = parser.parse_args(argv)
    out = write_example_imagefolder(args.path) if args.kind == "imagefolder" else write_example_csv(args.path)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
