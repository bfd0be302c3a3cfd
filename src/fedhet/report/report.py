"""`write_report`: tables (Markdown + CSV) and learning curves for a set of run directories."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedhet.atomic import atomic_write_text
from fedhet.outpaths import check_output_dir, write_failed
from fedhet.report.cost import cost_section
from fedhet.report.experiments import split_experiments, split_note
from fedhet.report.novel import novel_section
from fedhet.report.plot import plot_curves
from fedhet.report.reading import read_table
from fedhet.report.runs import RunRecord, load_runs
from fedhet.report.setting import setting_section
from fedhet.report.stats import mean_ranks
from fedhet.report.table import AVG, Reference, Table, format_cell, make_table, to_csv, to_markdown
from fedhet.report.tuned import is_tuning_job, tuned_readings, tuned_rows, tuned_section
from fedhet.report.tuning import tuning_section


@dataclass(frozen=True)
class ReportPaths:
    """The files `write_report` wrote (iterating gives them), and the short summary a terminal shows instead of
    the Markdown."""

    markdown: Path
    csv: Path
    curves: Path
    summary: str = ""

    def __iter__(self) -> Iterator[Path]:
        return iter((self.markdown, self.csv, self.curves))


def _runs_section(runs: Sequence[RunRecord], out_dir: Path) -> str:
    lines = [
        "## Runs\n",
        "| run | dataset | method | seed | rounds | wall time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        done = "?" if r.rounds_completed is None else str(r.rounds_completed)
        planned = f"/{r.rounds}" if r.rounds is not None else ""
        flag = " (incomplete)" if r.rounds is not None and r.rounds_completed not in (None, r.rounds) else ""
        wall = "" if r.wall_time_s is None else f"{r.wall_time_s:.1f}"
        try:
            where = os.path.relpath(r.path, out_dir)
        except ValueError:  # different drive (Windows)
            where = str(r.path)
        lines.append(f"| `{where}` | {r.dataset} | {r.method} | {r.seed} | {done}{planned}{flag} | {wall} |")
    return "\n".join(lines) + "\n"


def write_report(
    run_dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    metrics: Sequence[str] = ("accuracy", "balanced_accuracy"),
    reference: Reference | None = None,
    by: str = "method",
    reference_dataset: str | None = None,
) -> ReportPaths:
    """Write report.md, report.csv and curves.png to `out_dir` for the given runs.

    `run_dirs` are run directories or parents searched recursively for summary.json. The Markdown has one
    table per dataset and metric (`reference`, in paper units, is added to the first metric's tables,
    see `make_table`), the
    curves of the "avg" test accuracy, and the list of runs. The CSV has every metric in long format.
    """
    out = check_output_dir(Path(out_dir), "the report folder")
    runs = load_runs(run_dirs)
    try:
        return _write(runs, out, metrics, reference, by, reference_dataset)
    except OSError as err:
        raise write_failed(out, err, "report folder") from err


def _reading(table: Table) -> str:
    """The plain-language sentences under each metric's tables (`report.reading`)."""
    lines = [f"**Reading ({table.metric}).** {text}\n" for t in table.datasets
             if (text := read_table(t, table.percent, table.metric, table.lower_is_better))]
    return "\n" + "\n".join(lines) if lines else ""


def leaderboard(table: Table) -> str:
    """Across datasets: each method's mean rank on the client average of `table`'s metric ('' for one dataset)."""
    if len(table.datasets) < 2:
        return ""
    scores = {t.dataset: {c: cell.mean for c in t.columns if (cell := t.cells.get((AVG, c))) is not None
                          and not cell.reference} for t in table.datasets}
    ranks = sorted(mean_ranks(scores, table.lower_is_better).items(), key=lambda item: item[1][0])
    lines = ["## Across datasets\n",
             f"Mean rank of each method on the client-average {table.metric} (1 = best; ties share a rank), over "
             f"the {len(scores)} datasets; a method run on fewer datasets is ranked only where it ran.\n",
             "| method | mean rank | datasets |", "|---|---|---|"]
    lines += [f"| {method} | {rank:.2f} | {n} |" for method, (rank, n) in ranks]
    return "\n".join(lines) + "\n"


def _write(runs: Sequence[RunRecord], out: Path, metrics: Sequence[str], reference: Reference | None, by: str,
           reference_dataset: str | None) -> ReportPaths:
    out.mkdir(parents=True, exist_ok=True)
    jobs = [r for r in runs if is_tuning_job(r)]  # a tuned sweep's tuning jobs: in their sections, not the tables
    results = [r for r in runs if not is_tuning_job(r)]
    if not results:  # nothing but tuning jobs: they are the results
        results, jobs = list(runs), []
    split = split_experiments(results)
    note, runs = split_note(results, split), split
    tables = [
        make_table(runs, m, reference if i == 0 else None, by=by, reference_dataset=reference_dataset)
        for i, m in enumerate(metrics)
    ]
    curves = plot_curves(runs, out / "curves.png", metric="accuracy", by=by)
    n_sets = len({(r.dataset, r.method) for r in runs})
    md = [
        "# fedhet report\n",
        setting_section([r.config for r in runs]),
        f"{len(runs)} runs, {n_sets} (dataset, method) groups.\n",
        "## Final metrics\n",
        note,
        *(to_markdown(t) + _reading(t) for t in tables),
        leaderboard(tables[0]),
        tuned_section([*runs, *jobs], out),
        cost_section(runs, by),
        novel_section(runs, by),
        tuning_section([*runs, *jobs], out),
        "## Learning curves\n",
        "Average test accuracy over clients vs round; line = mean over seeds, band = ± sample std.\n",
        f"![learning curves]({curves.name})\n",
        _runs_section([*runs, *jobs], out),
    ]
    markdown = atomic_write_text(out / "report.md", "\n".join(md))
    csv_path = to_csv(tables, out / "report.csv")
    tuning = "".join(textwrap.fill(t, 110, initial_indent="  ", subsequent_indent="  ") + "\n"
                     for t in tuned_readings(tuned_rows([*runs, *jobs])))
    return ReportPaths(markdown, csv_path, curves, terminal_summary(tables[0]) + tuning + note)


def terminal_summary(table: Table) -> str:
    """Per dataset: the client average of `table`'s metric per method, best first, and the reading."""
    lines = []
    for t in table.datasets:
        unit = " (%)" if table.percent else ""
        lines.append(f"{t.dataset}: client-average {table.metric}{unit}, mean ± std over seeds")
        cells = [(c, cell) for c in t.columns if (cell := t.cells.get((AVG, c))) is not None and not cell.reference]
        cells.sort(key=lambda item: item[1].mean, reverse=not table.lower_is_better)
        width = max((len(c) for c, _ in cells), default=0)
        lines += [f"  {c:<{width}}  {format_cell(cell, table.percent)}  (n={cell.n})" for c, cell in cells]
        if text := read_table(t, table.percent, table.metric, table.lower_is_better):
            lines.append(textwrap.fill(text, 110, initial_indent="  ", subsequent_indent="  "))
    return "\n".join(lines) + "\n"
