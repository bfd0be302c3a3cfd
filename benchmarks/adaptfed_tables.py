"""AdaptFED's tables in the paper's layout from the runs of benchmarks/adaptfed_tables.sh.

    python benchmarks/adaptfed_tables.py runs/adaptfed_path50 runs/adaptfed_dir03 --out docs/results/adaptfed/tables.md
    python benchmarks/adaptfed_tables.py runs/adaptfed_novel --novel --out docs/results/adaptfed/novel.md

Accuracy tables: rows = methods (run labels), columns = the settings (one run folder each), cells = mean ± sample
std over seeds of the final average test accuracy of the clients' deployed models (%), n seeds; then the
parameters and bytes one client receives and sends per round (the runs' recorded traffic) and seconds per round.
--novel: Table 8, from each run's novel.json (`fedhet.report.novel`: held-out clients' accuracy before adapting,
after the last epoch, best, and epochs to reach 99% of the best; mean over clients, then mean ± std over seeds).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fedhet.atomic import atomic_write_text
from fedhet.report.cost import format_params, traffic_mean
from fedhet.report.novel import novel_section
from fedhet.report.runs import RunRecord, load_runs
from fedhet.report.setting import run_configs, setting_section

ORDER = ["local_t", "fedavg_t", "vanilla_t", "fedper_t", "pfedhn_t", "fedtp_t", "adaptfed", "p_mlp", "p_norm",
         "p_encoder", "hnet_lr01", "hnet_lr03", "lora4", "task_aware", "plus_fedper", "fedavg", "fedprox", "fedbn",
         "fedrep", "fedavg_lstm", "fedprox_lstm", "fedper_lstm"]
NAMES = {"local_t": "Local-T", "fedavg_t": "FedAvg-T", "vanilla_t": "Vanilla-T", "fedper_t": "FedPER-T",
         "pfedhn_t": "pFedHN-T", "fedtp_t": "FedTP-T (ViT)", "adaptfed": "AdaptFED (P = focal modulation)",
         "p_mlp": "AdaptFED, P = MLP layers", "p_norm": "AdaptFED, P = normalization layers",
         "p_encoder": "AdaptFED, P = encoder (patch embedding)", "fedavg": "FedAvg (CNN)", "fedprox": "FedProx (CNN)",
         "fedbn": "FedBN (CNN)", "fedrep": "FedRep (CNN)", "hnet_lr01": "AdaptFED, hypernetwork lr 0.1",
         "hnet_lr03": "AdaptFED, hypernetwork lr 0.3", "lora4": "AdaptFED, LoRA factors r=4 (ours)",
         "task_aware": "AdaptFED, task-aware (ours)", "plus_fedper": "AdaptFED + FedPER (local head)",
         "fedavg_lstm": "FedAvg (LEAF LSTM)", "fedprox_lstm": "FedProx (LEAF LSTM, mu 0.01)",
         "fedper_lstm": "FedPER (LEAF LSTM)"}


def cell(values: list[float]) -> str:
    if not values:
        return "–"
    mean = 100 * statistics.fmean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f} ({len(values)})"


def final_accuracy(run: RunRecord) -> float | None:
    avg = run.final.get("avg")
    return None if avg is None or run.rounds_completed != run.rounds else float(avg["accuracy"])


def labels_in(runs: list[RunRecord]) -> list[str]:
    found = {r.label for r in runs}
    return [m for m in ORDER if m in found] + sorted(found - set(ORDER))


def accuracy_table(folders: list[Path], headers: list[str] | None = None) -> str:
    """One row per method; one column per folder, headed by `headers` (default: the folders' names)."""
    runs = {f.name: load_runs(f) for f in folders}
    every = [r for rs in runs.values() for r in rs]
    columns = " | ".join(headers or runs)
    lines = [f"| method | {columns} | params down / up per client-round | bytes down / up | s / round |",
             "|---|" + "---|" * (len(runs) + 3)]
    for label in labels_in(every):
        cells = [cell([a for r in rs if r.label == label and (a := final_accuracy(r)) is not None])
                 for rs in runs.values()]
        mine = [r for r in every if r.label == label]
        down, up = (format_params(traffic_mean(mine, f"{way}_params")) for way in ("down", "up"))
        params = f"{down} / {up}"
        sent = f"{_bytes(traffic_mean(mine, 'down_bytes'))} / {_bytes(traffic_mean(mine, 'up_bytes'))}"
        times = [float(r.summary["round_time_s"]) for r in mine if "round_time_s" in r.summary]
        seconds = f"{statistics.fmean(times):.1f}" if times else "?"
        lines.append(f"| {NAMES.get(label, label)} | " + " | ".join(cells) + f" | {params} | {sent} | {seconds} |")
    return "\n".join(lines) + "\n"


def _bytes(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="one run folder per setting (runs/<name>)")
    parser.add_argument("--novel", action="store_true", help="Table 8 from the runs' novel.json")
    parser.add_argument("--headers", default="", help="comma-separated column headers, one per folder")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    headers = args.headers.split(",") if args.headers else None
    if headers is not None and len(headers) != len(args.folders):
        parser.error(f"--headers names {len(headers)} columns for {len(args.folders)} folders")
    text = (novel_section(load_runs(args.folders), heading=False) if args.novel
            else accuracy_table(args.folders, headers))
    atomic_write_text(args.out, setting_section(run_configs(args.folders)) + "\n" + text)
    print(text)


if __name__ == "__main__":
    main()
