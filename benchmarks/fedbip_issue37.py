"""Issue 37's FedBiP tables (docs/results/fedbip.md, "Issue 37"): Table 1 per domain with the one-shot baselines
(FedD3, DENSE, FedDEO, FGL: simplified stand-ins, each run's `stand_in:` note printed under the table) and FedBiP
with both start latents side by side (`upload`: runs/fedbip_digits, the runs made before
the switch; `fresh`: runs/fedbip_digits_fresh, the official code's behaviour), the size sweep with both, and
Table 3's rows that read z(T) with both (runs/fedbip_ablation vs runs/fedbip_ablation_fresh).

    python benchmarks/fedbip_issue37.py --out docs/results/fedbip/issue37.md [--runs runs]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from fedbip_tables import ABLATION, SIZES, accuracies, cell, runs_of

OLD, NEW = "fedbip_digits", "fedbip_digits_fresh"
BASELINES = {"fedavg": "FedAvg (50 rounds)", "central": "Central (oracle)", "fedd3": "FedD3 (1 shot)",
             "dense": "DENSE (1 shot)", "feddeo": "FedDEO (1 shot)", "fgl": "FGL (1 shot)",
             "prompt_only": "LDM, prompt only"}
FEDBIP = {"fedbip_s": "S", "fedbip_m": "M", "fedbip_l": "L"}


def table1(root: Path) -> str:
    columns = [(OLD, v, t) for v, t in BASELINES.items()]
    columns += [(name, v, f"FedBiP-{t} ({mode})") for v, t in FEDBIP.items()
                for name, mode in ((OLD, "upload"), (NEW, "fresh"))]
    found = runs_of(root, NEW, "fedbip_l") or runs_of(root, OLD, "fedbip_l")
    clients = [c for c in json.loads((found[0] / "summary.json").read_text())["final"] if c != "avg"] if found else []
    lines = ["| domain | " + " | ".join(t for _, _, t in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for c in [*clients, "avg"]:
        lines.append(f"| {c} | " + " | ".join(cell(accuracies(root, n, v, c)) for n, v, _ in columns) + " |")
    return "\n".join(lines) + "\n"


# what a baseline's runs' `stand_in:` does not say (their runs carry common.yaml's note): docs/methods.md's label
SIMPLIFIED = {"fedd3": "FedD3 simplified: an RBF kernel on the inputs instead of KIP's NTK",
              "fgl": "FGL simplified: no BLIP-2 here, every image's caption is the class-name template"}


def baseline_notes(root: Path) -> str:
    """The `stand_in:` note of each one-shot baseline's runs (from their config.yaml), one line per distinct note,
    after the simplification their note leaves out (SIMPLIFIED)."""
    lines = []
    for variant in ("fedd3", "dense", "feddeo", "fgl"):
        notes = {str((yaml.safe_load((run / "config.yaml").read_text()) or {}).get("stand_in") or "")
                 for run in runs_of(root, OLD, variant) if (run / "config.yaml").is_file()}
        label = f"{SIMPLIFIED[variant]}; " if variant in SIMPLIFIED else ""
        lines += [f"- **{BASELINES[variant]}**: {label}{note} (its runs' `stand_in:`)"
                  for note in sorted(notes) if note]
    return "\n".join(["Stand-ins of the one-shot baselines (simplified; docs/fedbip.md, one section each):", "",
                      *lines]) + "\n" if lines else ""


def sizes(root: Path) -> str:
    lines = ["| start latent | " + " | ".join(SIZES.values()) + " |", "|---" * (len(SIZES) + 1) + "|"]
    for name, mode in ((OLD, "upload (before)"), (NEW, "fresh (official)")):
        lines.append(f"| {mode} | " + " | ".join(cell(accuracies(root, name, v)) for v in SIZES) + " |")
    return "\n".join(lines) + "\n"


def ablation(root: Path) -> str:
    lines = ["| z(T) | Ŝ | V | upload (before) | fresh (official) |", "|---|---|---|---|---|"]
    for variant, marks in ABLATION.items():
        new = cell(accuracies(root, "fedbip_ablation_fresh", variant)) if "✓" in marks[0] else "same (no z(T))"
        lines.append("| " + " | ".join(marks) + f" | {cell(accuracies(root, 'fedbip_ablation', variant))} | {new} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    args = parser.parse_args()
    text = (f"# FedBiP, issue 37: start latents and one-shot baselines\n\nTable 1 (accuracy %, mean ± std over "
            f"seeds; n shown when not 3):\n\n{table1(args.runs)}\n{baseline_notes(args.runs)}\n"
            f"Size sweep (avg %):\n\n{sizes(args.runs)}\n"
            f"Table 3, FedBiP-M (avg %):\n\n{ablation(args.runs)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
