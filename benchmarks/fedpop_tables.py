"""FedPop's paper tables (Chen et al., AAAI 2025; spec fedpop.md §5) from `fedhet tune` run directories, as
benchmarks/fedpop_tables.sh lays them out: <runs>/<prefix>_<setting>/<dataset>/fedavg+<wrapper>+<tuner>[+<score>]/
seed<k>/summary.json (with config.yaml beside it). Each cell is "global (finetuned)" test accuracy in %, mean ±
sample std over the seeds found (the average over clients of the final configuration's global model, and of that
model finetuned once per client with beta^0); a cell with fewer seeds than --seeds names says so, a cell with a
run in which every configuration diverged names its seed and round ([halted: s1@14]: the job ended there and chose
among the configurations' last finite states), and a cell with no finished run shows "—", so partial results
tabulate.

    python benchmarks/fedpop_tables.py runs --out docs/results/fedpop        # table1.md ... table5.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedhet.report.setting import run_configs, setting_section

MISSING = "—"
FMNIST = {"t2_iid": "IID", "t2_dir1": "NIID (Dir 1.0)", "t2_dir05": "NIID (Dir 0.5)"}
SHAKESPEARE = {"t2_shk_iid": "Shakespeare IID", "t2_shk_niid": "Shakespeare NIID"}
CROSS_SILO = {"digits": "Digits", "pacs": "PACS"}
TUNERS = {"none": "None", "fedex": "FedEx", "fedpop": "FedPop"}
WRAPPERS = {"rs": "RS", "sha": "SHA"}


@dataclass(frozen=True)
class Run:
    """One finished tuning run: where it sits in the tables and what it scored."""

    setting: str  # the run name without the prefix (t2_iid, t3, ...) or, for t3, the dataset
    wrapper: str
    tuner: str
    score: str  # FedPop-G's score rule (App. Table 5)
    split: str  # FedPop's group sizes (tune.split); runs kept under a "+rank" label ran before it was a switch
    seed: int
    global_acc: float
    finetuned_acc: float
    tried_alpha: int
    tried_beta: int
    halted: int | None = None  # the round in which every configuration diverged (the job ended there)


Cells = dict[tuple[str, str, str, str], list[Run]]  # (setting, wrapper, tuner, score) -> runs over seeds


def load_runs(roots: list[Path], prefix: str) -> list[Run]:
    """Every summary.json under `roots` whose run name starts with `<prefix>_` and that has a `tune` section."""
    runs = []
    for path in sorted(p for root in roots for p in root.rglob("summary.json")):
        summary = json.loads(path.read_text())
        name, tune = str(summary.get("name", "")), summary.get("tune")
        if not name.startswith(f"{prefix}_") or not isinstance(tune, dict):
            continue
        config = yaml.safe_load((path.parent / "config.yaml").read_text()) if (path.parent / "config.yaml").is_file() \
            else {}
        setting = name[len(prefix) + 1:]
        if setting == "t3":
            setting = str(summary["dataset"])
        runs.append(Run(setting=setting, wrapper=tune["wrapper"], tuner=tune["tuner"],
                        score=str((config.get("tune") or {}).get("score", "powerlaw")),
                        split=str((config.get("tune") or {}).get("split", "rank" if path.parent.parent.name.endswith(
                            "+rank") else "official")), seed=int(summary["seed"]),
                        global_acc=100 * summary["final"]["avg"]["accuracy"],
                        finetuned_acc=100 * tune["finetuned"]["avg"]["accuracy"],
                        tried_alpha=int(tune["tried_alpha"]), tried_beta=int(tune["tried_beta"]),
                        halted=summary.get("halted")))
    return runs


def group(runs: list[Run]) -> Cells:
    """The runs by cell, each cell's runs over seeds."""
    cells: Cells = defaultdict(list)
    for run in runs:
        if run.split == "official":  # the default: runs with another split are kept, not tabulated
            cells[(run.setting, run.wrapper, run.tuner, run.score)].append(run)
    return cells


def mean_std(values: list[float]) -> str:
    """The mean ± sample std, or the value alone for one seed."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def cell(cells: Cells, key: tuple[str, str, str, str], seeds: int, finetuned: bool = True) -> str:
    """One cell, global (finetuned) over its seeds; "—" without runs, [halted: ...] for runs that ended early,
    and [n=k] when seeds are missing."""
    runs = cells.get(key, [])
    if not runs:
        return MISSING
    text = mean_std([r.global_acc for r in runs])
    if finetuned:
        text += f" ({mean_std([r.finetuned_acc for r in runs])})"
    halted = [f"s{r.seed}@{r.halted}" for r in runs if r.halted]
    text += f" [halted: {', '.join(halted)}]" if halted else ""
    return text + (f" [n={len(runs)}]" if len(runs) < seeds else "")


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def table1(cells: Cells, seeds: int) -> str:
    """Table 1: the number of distinct alpha / beta vectors that trained (mean over seeds), per Fashion-MNIST
    partition (the paper counts CIFAR-10's)."""
    rows = []
    for wrapper in WRAPPERS:
        for tuner in TUNERS:
            row = [WRAPPERS[wrapper], TUNERS[tuner]]
            for setting in FMNIST:
                runs = cells.get((setting, wrapper, tuner, "powerlaw"), [])
                row.append(MISSING if not runs else f"{statistics.mean(r.tried_alpha for r in runs):.1f} / "
                           f"{statistics.mean(r.tried_beta for r in runs):.1f}")
            rows.append(row)
    header = ["Wrapper", "Tuning Algorithm", *(f"tried α / β, {label}" for label in FMNIST.values())]
    return ("## Table 1: number of HP vectors tried (Fashion-MNIST, the CIFAR-10 stand-in; mean over seeds)\n\n"
            + markdown(header, rows))


def table2(cells: Cells, seeds: int) -> str:
    """Table 2: wrapper x tuner rows, the Fashion-MNIST and Shakespeare settings as columns."""
    settings = {**{k: f"F-MNIST {v}" for k, v in FMNIST.items()}, **SHAKESPEARE}
    rows = [[WRAPPERS[w], TUNERS[t], *(cell(cells, (s, w, t, "powerlaw"), seeds) for s in settings)]
            for w in WRAPPERS for t in TUNERS]
    return ("## Table 2: test accuracy (%), global (finetuned), mean ± std over seeds\n\n"
            "Fashion-MNIST stands in for CIFAR-10.\n\n" + markdown(["Wrapper", "Tuning Algorithm",
                                                                    *settings.values()], rows))


def table3(cells: Cells, seeds: int) -> str:
    """Table 3: SHA, SHA + FedEx, SHA + FedPop on the cross-silo feature-shift datasets."""
    names = {"none": "SHA", "fedex": "FedEx", "fedpop": "FedPop"}
    rows = [[names[t], *(cell(cells, (s, "sha", t, "powerlaw"), seeds) for s in CROSS_SILO)] for t in names]
    return ("## Table 3: cross-silo feature shift, test accuracy (%), global (finetuned)\n\n"
            + markdown(["Tuning Algorithm", *CROSS_SILO.values()], rows))


def table4(cells: Cells, seeds: int) -> str:
    """Table 4: the RS ablation of FedPop's parts (global accuracy only, as the paper)."""
    names = {"none": "RS", "fedpop_g": "FedPop-G", "fedpop_l": "FedPop-L", "fedpop": "FedPop"}
    rows = [[names[t], *(cell(cells, (s, "rs", t, "powerlaw"), seeds, finetuned=False) for s in FMNIST)]
            for t in names]
    return ("## Table 4: ablation (RS wrapper, Fashion-MNIST), global test accuracy (%)\n\n"
            + markdown(["Tuning Algorithm", *FMNIST.values()], rows))


def table5(cells: Cells, seeds: int) -> str:
    """App. Table 5: FedPop-G's score rule (SHA + FedPop)."""
    names = {"avg": "avg", "last": "last", "powerlaw": "power-law"}
    rows = [[names[r], *(cell(cells, (s, "sha", "fedpop", r), seeds) for s in FMNIST)] for r in names]
    return ("## App. Table 5: score computation (SHA + FedPop, Fashion-MNIST), test accuracy (%), global "
            "(finetuned)\n\n" + markdown(["Computation Method", *FMNIST.values()], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", type=Path, default=[Path("runs")], help="folders holding the runs")
    parser.add_argument("--prefix", default="fedpop", help="run names start with <prefix>_ (default fedpop)")
    parser.add_argument("--seeds", default="1,2,3", help="the seeds asked for; shorter cells show [n=k]")
    parser.add_argument("--out", type=Path, default=Path("docs/results/fedpop"))
    args = parser.parse_args(argv)
    cells = group(load_runs(args.roots, args.prefix))
    seeds = len([s for s in args.seeds.split(",") if s.strip()])
    args.out.mkdir(parents=True, exist_ok=True)
    configs = [c for c in run_configs(args.roots) if str(c.get("name", "")).startswith(f"{args.prefix}_")]
    for number, build in enumerate((table1, table2, table3, table4, table5), start=1):
        path = args.out / f"table{number}.md"
        path.write_text(setting_section(configs) + "\n" + build(cells, seeds))
        print(f"wrote {path}")
    print(f"{sum(len(v) for v in cells.values())} runs in {len(cells)} cells")


if __name__ == "__main__":
    main()
