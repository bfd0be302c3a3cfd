"""The "Novel clients" section of a report: the held-out clients' adaptation (engine/novel.py, novel.json)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence

from fedhet.report.cost import format_params
from fedhet.report.runs import RunRecord
from fedhet.report.stats import mean_std
from fedhet.report.table import Cell, format_cell
from fedhet.yaml_input import JSONDict

NOVEL_FILE = "novel.json"


def novel_results(runs: Sequence[RunRecord], by: str = "method") -> dict[tuple[str, str, str], list[JSONDict]]:
    """(dataset, method or name, adapted part) -> the novel.json entries of the runs that have one."""
    found: dict[tuple[str, str, str], list[JSONDict]] = {}
    for run in runs:
        path = run.path / NOVEL_FILE
        if not path.is_file():
            continue
        for part, result in json.loads(path.read_text()).items():
            key = (run.dataset, run.label if by == "method" else (run.name or run.label), part)
            found.setdefault(key, []).append(result)
    return found


def _pct(values: list[float]) -> str:
    """'85.23 ± 1.20' (%) over runs; the mean alone for one run."""
    return format_cell(Cell(*mean_std(values), len(values)), percent=True)


def novel_section(runs: Sequence[RunRecord], by: str = "method", heading: bool = True) -> str:
    """A Markdown table of the held-out clients' accuracy before adapting, after the last epoch and at best, and
    the epochs to reach `reach` x the best (means over clients, then mean ± std over runs); "" when no run has
    novel clients."""
    found = novel_results(runs, by)
    if not found:
        return ""
    lines = (["## Novel clients\n", "Clients held out of training (`novel.*`), each adapting `part` on its own "
              "training split after the last round; test accuracy (%) over the held-out clients, mean ± std over "
              "runs.\n"] if heading else [])
    lines += ["| dataset | method | part | trainable params | before | last epoch | best | epochs to reach | runs |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (dataset, method, part), results in sorted(found.items()):
        params = statistics.fmean(c["trainable_params"] for r in results for c in r["clients"])
        reach = statistics.fmean(r["mean_epochs_to_reach"] for r in results)
        lines.append(f"| {dataset} | {method} | {part} | {format_params(params)} | "
                     f"{_pct([r['mean_accuracy'][0] for r in results])} | {_pct([r['mean_final'] for r in results])} | "
                     f"{_pct([r['mean_best'] for r in results])} | {reach:.1f} | {len(results)} |")
    return "\n".join(lines) + "\n"
