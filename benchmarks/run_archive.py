"""Keep finished benchmark runs in git, so a reproduction can span sessions on machines that start empty.

    python benchmarks/run_archive.py save runs/adaptfed_path100 runs/adaptfed/focalnet_mnist.pt
    python benchmarks/run_archive.py restore

`save` copies each finished run directory found under the given paths (a folder holding summary.json; a path
that does not exist holds none) into
docs/results/runs/ at the same path below runs/, without its checkpoints, lock or any file over 2 MiB; JSON-lines
files are stored gzipped. A file given by name (a pretrained backbone) is copied as it is. `restore` copies the
archive back into runs/, skipping what is already there, so `fedhet sweep` finds those runs finished (their
summary.json and config.yaml are the originals) and the table scripts read them. Nothing here changes a number:
the archive holds the files the runs wrote.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs"
ARCHIVE = ROOT / "docs" / "results" / "runs"
SKIP_DIRS = {"checkpoints"}
SKIP_FILES = {".lock"}
MAX_BYTES = 2 * 1024 * 1024


def _run_dirs(path: Path) -> list[Path]:
    if (path / "summary.json").is_file():
        return [path]
    return sorted(p.parent for p in path.rglob("summary.json") if not SKIP_DIRS & set(p.parts))


def _save_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".jsonl":
        with src.open("rb") as fin, gzip.GzipFile(dst.with_name(dst.name + ".gz"), "wb", mtime=0) as fout:
            shutil.copyfileobj(fin, fout)
    else:
        shutil.copyfile(src, dst)


def save(paths: list[Path], runs: Path = RUNS, archive: Path = ARCHIVE) -> int:
    """Copy the finished runs (and the files) among `paths`, all below `runs`, into `archive`; the count copied."""
    count = 0
    for path in paths:
        rel = path.resolve().relative_to(runs.resolve())
        if path.is_file():
            _save_file(path, archive / rel)
            count += 1
            continue
        for run in _run_dirs(path):
            kept = archive / run.resolve().relative_to(runs.resolve())
            for src in run.rglob("*"):
                inner = src.relative_to(run)
                if src.is_dir() or SKIP_DIRS & set(inner.parts) or src.name in SKIP_FILES:
                    continue
                if (size := src.stat().st_size) > MAX_BYTES:
                    print(f"left out {src} ({size / 2**20:.1f} MiB)")
                    continue
                _save_file(src, kept / inner)
            count += 1
    return count


def restore(runs: Path = RUNS, archive: Path = ARCHIVE) -> int:
    """Copy `archive` back into `runs`, leaving files that exist there alone; the count of files copied."""
    count = 0
    for src in sorted(archive.rglob("*")):
        if src.is_dir():
            continue
        rel = src.relative_to(archive)
        dst = runs / (rel.with_suffix("") if src.suffix == ".gz" else rel)
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".gz":
            with gzip.open(src, "rb") as fin, dst.open("wb") as fout:
                shutil.copyfileobj(fin, fout)
        else:
            shutil.copyfile(src, dst)
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    save_cmd = sub.add_parser("save", help="copy finished runs (or files) under runs/ into the archive")
    save_cmd.add_argument("paths", nargs="+", type=Path)
    sub.add_parser("restore", help="copy the archive back into runs/, skipping what exists")
    args = parser.parse_args()
    if args.command == "save":
        print(f"saved {save(args.paths)} runs / files into {ARCHIVE.relative_to(ROOT)}")
    else:
        print(f"restored {restore()} files into {RUNS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
