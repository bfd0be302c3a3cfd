"""Write the stand-in note into generated results pages whose runs predate the `stand_in:` config key.

A page generated now (`fedhet report`, benchmarks/*_tables.py) prints the note from its runs' configs. Pages made
from runs that predate the key get it here, from the config file their runs were made with (PAGES), with a
remark saying so; the block is updated in place, so this is safe to re-run (after a table script regenerated a
page from such runs, too).

    python benchmarks/stamp_stand_ins.py            # every page listed in PAGES
    python benchmarks/stamp_stand_ins.py --check    # exit 1 when a listed page lacks its block
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path

from fedhet.atomic import atomic_write_text
from fedhet.config import load_config
from fedhet.report.setting import BEGIN, END, NONE_DECLARED, stand_in_lines

ROOT = Path(__file__).resolve().parents[1]
PREDATES = "predate the `stand_in:` key"
# page glob (relative to docs/results) -> the config(s) its runs were made with; the first match wins
PAGES: list[tuple[str, ...]] = [
    ("feddat/*/report.md", "configs/feddat/common.yaml"),
    ("feddat/minilm.md", "configs/feddat/minilm.yaml"),
    ("feddat/*.md", "configs/feddat/common.yaml"),
    ("adaptfed/adaptfed_shakespeare/report.md", "configs/adaptfed/shakespeare.yaml"),
    ("adaptfed/shakespeare.md", "configs/adaptfed/shakespeare.yaml"),
    ("adaptfed/sfda_pacs_effnet/report.md", "configs/adaptfed/sfda_pacs.yaml"),
    ("adaptfed/*.md", "configs/adaptfed/common.yaml"),
    ("adaptfed/*/report.md", "configs/adaptfed/common.yaml"),
    ("ditto_mmd/synthetic*/report.md", "configs/ditto_mmd/synthetic.yaml"),
    ("ditto_mmd/digits_cnn/report.md", "configs/ditto_mmd/digits_cnn.yaml"),
    ("ditto_mmd/digits/report.md", "configs/ditto_mmd/digits.yaml"),
    ("ditto_mmd/heart/report.md", "configs/ditto_mmd/heart_disease.yaml"),
    ("ditto_mmd/fmnist*/report.md", "configs/ditto_mmd/fashion_mnist.yaml"),
    ("fraug/*surf*/report.md", "configs/office_caltech10_surf.yaml"),
    ("fraug/*pacs*/report.md", "configs/cpu/pacs.yaml"),
    ("fraug/*digits*/report.md", "configs/cpu/digits.yaml"),
    ("cpu_pacs/report.md", "configs/cpu/pacs.yaml"),
    ("cpu_digits/report.md", "configs/cpu/digits.yaml"),
    ("quickstart/report.md", "configs/quickstart.yaml"),
    ("fedpop/reports/fedpop_t2_shk*/report.md", "configs/fedpop/shakespeare.yaml"),
    ("fedpop/reports/fedpop_t2_*/report.md", "configs/fedpop/fashion_mnist.yaml"),
    ("fedpop/reports/fedpop_t3/report.md", "configs/fedpop/digits.yaml"),
    ("fedpop/table3.md", "configs/fedpop/digits.yaml", "configs/fedpop/pacs.yaml"),
    ("fedpop/table2.md", "configs/fedpop/fashion_mnist.yaml", "configs/fedpop/shakespeare.yaml"),
    ("fedpop/table*.md", "configs/fedpop/fashion_mnist.yaml"),
    ("fedbip/fedbip_fashion*/report.md", "configs/fedbip/label_shift.yaml"),
    ("fedbip/*/report.md", "configs/fedbip/common.yaml"),
    ("fedbip/ablation.md", "configs/fedbip/ablation.yaml"),
    ("fedbip/*.md", "configs/fedbip/common.yaml", "configs/fedbip/label_shift.yaml"),
]


def note(config_paths: tuple[str, ...]) -> str:
    """The configs' stand-in notes, and where they come from."""
    lines = stand_in_lines([load_config(ROOT / path, []).to_dict() for path in config_paths])
    names = ", ".join(f"`{path}`" for path in config_paths)
    remark = (f"*(From {names}: these runs {PREDATES}, so the note is the config's as of now; each run's own "
              "settings are in the Runs table or the page's text.)*")
    return "\n\n".join([*lines, remark])


def stamped(text: str, stamp: str) -> str:
    """`text` with the stamp in its block. A block generated from runs without a note has its "None declared"
    line replaced (its setting lines stay); an earlier stamp is replaced; a note from the runs is kept. A page
    without a block gets one under its first `# ` title (at the top when there is none)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        inside, tail = rest.split(END, 1)
        if NONE_DECLARED in inside:
            inside = inside.replace(NONE_DECLARED, stamp)
        elif PREDATES in inside:  # from the first note through the remark's end
            start, end = inside.index("**Stand-ins"), inside.index(")*", inside.index(PREDATES)) + 2
            inside = inside[:start] + stamp + inside[end:]
        return head + BEGIN + inside + END + tail
    lines = text.splitlines(keepends=True)
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("# ")), 0)
    if at and at < len(lines) and lines[at].strip() == "":
        at += 1
    block = "\n\n".join([BEGIN, stamp, END]) + "\n"
    return "".join(lines[:at]) + block + "\n" + "".join(lines[at:])


def pages(results: Path) -> list[tuple[Path, tuple[str, ...]]]:
    """Every listed page under `results` with the configs of its first matching pattern."""
    out = []
    for path in sorted(results.rglob("*.md")):
        rel = path.relative_to(results).as_posix()
        configs = next((entry[1:] for entry in PAGES if fnmatch.fnmatch(rel, entry[0])), None)
        if configs is not None:
            out.append((path, configs))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    missing = []
    for path, config in pages(args.results):
        text = path.read_text(encoding="utf-8")
        if args.check:
            if BEGIN not in text:
                missing.append(path)
            continue
        atomic_write_text(path, stamped(text, note(config)))
        print(f"{path}  <- {', '.join(config)}")
    for path in missing:
        print(f"no stand-in block: {path}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
