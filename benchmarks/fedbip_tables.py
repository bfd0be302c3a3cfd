"""FedBiP's paper tables (spec fedbip.md §5) from the run directories benchmarks/fedbip_tables.sh writes:
runs/<name>/<dataset>/<variant>/seed<k>/{summary.json, privacy.json, checkpoints/latest.pt}. Each cell is the mean
± sample std over the seeds found (n shown when it is not 3); "—" where no run finished, so partial results
tabulate. Writes main.md (Tables 1 and 2: average accuracy), ablation.md (Table 3), sizes.md (Fig. 5's size
sweep), privacy.md (Table 4), cost.md (pretraining, upload, generation and classifier time) and one
real-vs-generated grid per feature-shift domain (grid_<domain>.png).

    python benchmarks/fedbip_tables.py --out docs/results/fedbip [--runs runs]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from fedhet.report.setting import run_configs, setting_section

MISSING = "—"
MAIN = {"fedbip_digits": "Feature shift (digits, 16-shot)", "fedbip_fashion_iid": "Label shift IID",
        "fedbip_fashion_dir05": "Label shift Dir 0.5", "fedbip_fashion_dir001": "Label shift Dir 0.01"}
METHODS = {"fedavg": "FedAvg", "central": "Central (oracle)", "prompt_only": "LDM, prompt only",
           "fedbip_s": "FedBiP-S", "fedbip_m": "FedBiP-M", "fedbip_l": "FedBiP-L"}
ABLATION = {"none": ("", "", ""), "v_only": ("", "", "✓"), "s_only": ("", "✓", ""), "zt_only": ("✓", "", ""),
            "all_no_perturb": ("✓", "✓ (σ = 0)", "✓"), "all": ("✓", "✓", "✓")}
SIZES = {"fedbip_x1": "1x", "fedbip_s": "2x (S)", "fedbip_x3": "3x", "fedbip_m": "5x (M)", "fedbip_l": "10x (L)"}


def runs_of(root: Path, name: str, variant: str) -> list[Path]:
    """The finished seed folders of one variant of one run name (any dataset)."""
    return sorted(p.parent for p in root.glob(f"{name}/*/{variant}/seed*/summary.json"))


def cell(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    """mean ± std (n=k unless k = 3)."""
    if not values:
        return MISSING
    xs = [v * scale for v in values]
    text = f"{statistics.mean(xs):.{digits}f}" + (f" ± {statistics.stdev(xs):.{digits}f}" if len(xs) > 1 else "")
    return text + ("" if len(xs) == 3 else f" (n={len(xs)})")


def accuracies(root: Path, name: str, variant: str, client: str = "avg") -> list[float]:
    return [json.loads((r / "summary.json").read_text())["final"][client]["accuracy"]
            for r in runs_of(root, name, variant)]


def main_table(root: Path) -> str:
    lines = ["| setting | " + " | ".join(METHODS.values()) + " |", "|---" * (len(METHODS) + 1) + "|"]
    for name, title in MAIN.items():
        lines.append(f"| {title} | " + " | ".join(cell(accuracies(root, name, v)) for v in METHODS) + " |")
    digits = runs_of(root, "fedbip_digits", "fedbip_l")
    if digits:  # per-domain rows of the feature-shift table (Table 1's layout)
        clients = [c for c in json.loads((digits[0] / "summary.json").read_text())["final"] if c != "avg"]
        lines += ["", "Feature shift, per domain (accuracy %):", "",
                  "| domain | " + " | ".join(METHODS.values()) + " |", "|---" * (len(METHODS) + 1) + "|"]
        for c in [*clients, "avg"]:
            lines.append(f"| {c} | " + " | ".join(cell(accuracies(root, 'fedbip_digits', v, c)) for v in METHODS)
                         + " |")
    return "\n".join(lines) + "\n"


def ablation_table(root: Path) -> str:
    lines = ["| z(T) | Ŝ | V | accuracy (%) |", "|---|---|---|---|"]
    lines.append(f"| FedAvg (multi-round) | | | {cell(accuracies(root, 'fedbip_digits', 'fedavg'))} |")
    for variant, marks in ABLATION.items():
        lines.append("| " + " | ".join(marks) + f" | {cell(accuracies(root, 'fedbip_ablation', variant))} |")
    return "\n".join(lines) + "\n"


def sizes_table(root: Path) -> str:
    lines = ["| synthetic set | " + " | ".join(SIZES.values()) + " |", "|---" * (len(SIZES) + 1) + "|"]
    for name in ("fedbip_digits", "fedbip_fashion_iid"):
        lines.append(f"| {MAIN[name]} | " + " | ".join(cell(accuracies(root, name, v)) for v in SIZES) + " |")
    return "\n".join(lines) + "\n"


def privacy_table(root: Path) -> str:
    lines = ["| setting | metric | FedAvg | Central | FedBiP-L |", "|---|---|---|---|---|"]
    for name, title in MAIN.items():
        for metric in ("entropy", "loss"):
            row = []
            for variant in ("fedavg", "central", "fedbip_l"):
                files = [r / "privacy.json" for r in runs_of(root, name, variant) if (r / "privacy.json").is_file()]
                gaps = [json.loads(f.read_text())["train_vs_test"]["table4"][metric] for f in files]
                row.append(cell(gaps, scale=1.0, digits=4))
            lines.append(f"| {title} | {metric} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def server_state(run: Path) -> tuple[Any, Any]:
    """(experiment, server state at the run's last checkpoint)."""
    from fedhet.config import load_config
    from fedhet.engine.checkpoint import load_checkpoint
    from fedhet.engine.experiment import build_experiment

    exp = build_experiment(load_config(run / "config.yaml", []))
    return exp, load_checkpoint(run / "checkpoints" / "latest.pt", exp.config.to_dict())["server"]


def cost_table(root: Path, ldm: Path) -> str:
    """Pretraining time; per FedBiP run, the client upload time, generation time per image, classifier time."""
    lines = []
    info = ldm / "fedhet_ldm.json"
    if info.is_file():
        meta = json.loads(info.read_text())
        lines += [f"LDM pretraining: {json.dumps(meta.get('seconds'))} seconds, steps {json.dumps(meta.get('steps'))}, "
                  f"parameters {json.dumps(meta.get('parameters'))}.", ""]
    lines += ["Images read from the cache (generated by an earlier run) count 0 and take no time.", "",
              "| run | seed | client upload (s, mean) | images generated | s per image | classifier (s) |",
              "|---|---|---|---|---|---|"]
    for summary in sorted(root.glob("fedbip_*/*/*/seed*/summary.json")):
        facts = json.loads(summary.read_text())
        run = summary.parent
        if facts.get("method") != "fedbip":
            continue
        if "fedbip" in facts:  # runs since 2026-11-28 keep their cost in summary.json
            cost = facts["fedbip"]["cost"]
        elif (run / "checkpoints" / "latest.pt").is_file():
            cost = server_state(run)[1].cost
        else:  # an archived run from before: its checkpoint was not kept
            continue
        lines.append(f"| {run.parts[-4]} / {run.parts[-2]} | {run.name} | {cost['client_seconds']:.0f} | "
                     f"{cost['generated_images']:.0f} | {cost['seconds_per_image']:.3f} | "
                     f"{cost['classifier_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def grids(root: Path, out: Path, per_class: int = 2) -> list[str]:
    """Real (top rows) vs generated (bottom rows) images of every client of the first FedBiP-L (or 1x: its first
    copy is L's) digits run whose checkpoint and generated images are on this machine."""
    import torch
    from torchvision.utils import save_image

    from fedhet.algorithms.fedbip import load_split

    found = [run for variant in ("fedbip_l", "fedbip_x1") for run in runs_of(root, "fedbip_digits", variant)
             if (run / "checkpoints" / "latest.pt").is_file()]
    if not found:
        return []
    exp, server = server_state(found[0])
    alg: Any = exp.algorithm
    if not all((alg.cache_folder() / key / "copy000_part0000.pt").is_file() for key in server.sets.values()):
        return []
    written = []
    for cid, key in sorted(server.sets.items()):
        client = exp.data.clients[cid]
        x, y = load_split(client.train_eval)
        real = alg.params.image_format().to_ldm(x, alg.image_side())
        part = torch.load(alg.cache_folder() / key / "copy000_part0000.pt", weights_only=True)
        rows = []
        for images, labels in ((real, y), (part["images"].float() / 255, part["labels"])):
            picks = [int(i) for c in range(exp.data.num_classes) for i in (labels == c).nonzero().flatten()[:per_class]]
            rows.append(images[picks])
        path = out / f"grid_{client.name}.png"
        save_image(torch.cat(rows), path, nrow=exp.data.num_classes * per_class, padding=1)
        written.append(path.name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    setting = setting_section(run_configs([args.runs / name for name in (*MAIN, "fedbip_ablation")]))
    for file, text in (("main.md", main_table(args.runs)), ("ablation.md", ablation_table(args.runs)),
                       ("sizes.md", sizes_table(args.runs)), ("privacy.md", privacy_table(args.runs)),
                       ("cost.md", cost_table(args.runs, args.runs / "ldm32"))):
        (args.out / file).write_text(setting + "\n" + text)
        print(f"{args.out / file}\n{text}")
    print("grids:", ", ".join(grids(args.runs, args.out)) or "none (no FedBiP-L digits run yet)")


if __name__ == "__main__":
    main()
