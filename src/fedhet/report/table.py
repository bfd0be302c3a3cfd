"""Result tables: final metrics per client (+ "avg") x method, mean ± std over seeds, one table per dataset."""

from __future__ import annotations

import csv
import io
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedhet.atomic import atomic_write_text
from fedhet.errors import FedhetError
from fedhet.report.experiments import split_experiments
from fedhet.report.runs import RunRecord
from fedhet.report.stats import mean_std, t_interval

AVG = "avg"
LOWER_IS_BETTER = ("loss",)
PAPER = " (paper)"  # the suffix of a published-value column's name

Reference = Mapping[str, Mapping[str, "Sequence[float | None] | float"]]


def is_percent(metric: str) -> bool:
    """Accuracy-like metrics (stored as fractions in [0, 1]) are shown in %."""
    return metric.endswith("accuracy")


@dataclass(frozen=True)
class Cell:
    """Summary of one (client, method) entry: mean and sample std over seeds, in the metric's raw unit."""

    mean: float
    std: float
    n: int
    seeds: tuple[int, ...] = ()
    reference: bool = False  # a value copied from a paper, not measured here
    values: tuple[float, ...] = ()  # one per seed, in the order of `seeds`

    @property
    def by_seed(self) -> dict[int, float]:
        return dict(zip(self.seeds, self.values, strict=True))


@dataclass
class DatasetTable:
    """One dataset's table: rows = clients then "avg", columns = methods (then paper columns)."""

    dataset: str
    rows: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)

    def best(self, row: str, lower_is_better: bool = False) -> set[str]:
        """Measured columns holding the best mean of `row` (ties all win); empty with fewer than 2 values."""
        cand = {c: cell.mean for c in self.columns
                if (cell := self.cells.get((row, c))) is not None and not cell.reference and not math.isnan(cell.mean)}
        if len(cand) < 2:
            return set()
        target = (min if lower_is_better else max)(cand.values())
        return {c for c, m in cand.items() if m == target}


@dataclass
class Table:
    """Tables for one metric, one per dataset, in order of first appearance."""

    metric: str
    datasets: list[DatasetTable]

    @property
    def lower_is_better(self) -> bool:
        return self.metric in LOWER_IS_BETTER

    @property
    def percent(self) -> bool:
        return is_percent(self.metric)


def make_table(
    runs: Sequence[RunRecord],
    metric: str = "accuracy",
    reference: Reference | None = None,
    by: str = "method",
    reference_dataset: str | None = None,
) -> Table:
    """Group runs by (dataset, method label) and summarise each client's final `metric` over seeds (`Cell`).

    Rows are clients in order of first appearance, then "avg"; columns are methods in order of first appearance;
    a run's column is its variant label (`RunRecord.label`, the method name unless the config set `label`),
    extended by the differing keys when runs of one label are not seeds of one experiment (`split_experiments`).
    `by="name"` groups by the config's `name` instead. `reference` adds published numbers: {client: {method:
    (mean, std) or mean}}, as printed in papers (in % for accuracy metrics); each becomes a column "<method>
    (paper)" next to the measured one, in no "best" comparison, in every dataset's table or only in
    `reference_dataset`'s when that is given.
    """
    if by not in ("method", "name"):
        raise FedhetError(f"make_table: by must be 'method' or 'name', got {by!r}")
    if not runs:
        raise FedhetError("make_table: no runs given")
    runs = split_experiments(runs)
    groups: dict[str, dict[str, list[RunRecord]]] = {}
    for run in runs:
        label = run.label if by == "method" else (run.name or run.label)
        groups.setdefault(run.dataset, {}).setdefault(label, []).append(run)

    scale = 100.0 if is_percent(metric) else 1.0
    tables: list[DatasetTable] = []
    for dataset, methods in groups.items():
        rows = list(dict.fromkeys(c for g in methods.values() for r in g for c in r.final if c != AVG))
        cells = _measured_cells(dataset, methods, rows, metric)
        if any((AVG, m) in cells for m in methods):
            rows.append(AVG)
        columns = list(methods)
        if reference and reference_dataset in (None, dataset):
            _add_reference(reference, scale, rows, columns, cells)
        tables.append(DatasetTable(dataset, rows, columns, cells))
    return Table(metric, tables)


def _measured_cells(dataset: str, methods: dict[str, list[RunRecord]], rows: list[str],
                    metric: str) -> dict[tuple[str, str], Cell]:
    """(client, method) -> the cell over the group's runs, for every client of `rows` and "avg"."""
    cells: dict[tuple[str, str], Cell] = {}
    for method, group in methods.items():
        seeds = [r.seed for r in group]
        if len(set(seeds)) < len(seeds):
            warnings.warn(
                f"{dataset}/{method}: several runs share a seed ({sorted(seeds)}); all are averaged",
                stacklevel=3,  # make_table's caller
            )
        for client in [*rows, AVG]:
            have = [(r.seed, r.final[client][metric]) for r in group if metric in r.final.get(client, {})]
            have = [(s, v) for s, v in have if not math.isnan(v)]
            if have:
                mean, std = mean_std([v for _, v in have])
                cells[(client, method)] = Cell(mean, std, len(have), tuple(s for s, _ in have),
                                               values=tuple(v for _, v in have))
    return cells


def _add_reference(reference: Reference, scale: float, rows: list[str], columns: list[str],
                   cells: dict[tuple[str, str], Cell]) -> None:
    """Insert a "<method> (paper)" column after each referenced method's column (or at the end), with its cells."""
    for ref_method in dict.fromkeys(m for per in reference.values() for m in per):
        col = ref_method + PAPER
        pos = columns.index(ref_method) + 1 if ref_method in columns else len(columns)
        columns.insert(pos, col)
        for client, per in reference.items():
            if client in rows and ref_method in per:
                val = per[ref_method]
                mean, std = val if isinstance(val, (tuple, list)) else (val, None)
                cells[(client, col)] = Cell(float(mean) / scale, math.nan if std is None else float(std) / scale, 0,
                                            reference=True)


def format_cell(cell: Cell | None, percent: bool, digits: int = 2) -> str:
    """'85.23 ± 1.20'; '85.23' when std is undefined (n=1 or no paper std); '–' for a missing cell or one with no
    value (a client without test data)."""
    if cell is None or math.isnan(cell.mean):
        return "–"
    s = 100.0 if percent else 1.0
    text = f"{cell.mean * s:.{digits}f}"
    if not math.isnan(cell.std):
        text += f" ± {cell.std * s:.{digits}f}"
    return text


def to_markdown(table: Table, digits: int = 2) -> str:
    """Markdown: one section per dataset; bold marks the best mean of each row."""
    unit = " (%)" if table.percent else ""
    out: list[str] = []
    for t in table.datasets:
        out.append(f"### {t.dataset}: {table.metric}{unit}\n")
        out.append("| client | " + " | ".join(t.columns) + " |")
        out.append("|---|" + "---|" * len(t.columns))
        for row in t.rows:
            best = t.best(row, table.lower_is_better)
            texts = []
            for col in t.columns:
                cell = t.cells.get((row, col))
                text = format_cell(cell, table.percent, digits)
                if col in best:
                    text = f"**{text}**"
                if cell is not None and not cell.reference:
                    text += f" (n={cell.n})"
                texts.append(text)
            label = f"**{row}**" if row == AVG else row
            out.append(f"| {label} | " + " | ".join(texts) + " |")
        out.append("")
        if ci := ci_line(t, table.percent, digits):
            out.append(ci)
    direction = "lowest" if table.lower_is_better else "highest"
    out.append(
        f"Cells: mean ± sample std (ddof=1) of the final {table.metric} over seeds; n = number of seeds. "
        f"Bold: {direction} mean in the row. '(paper)' columns are published values, not measured here.\n"
    )
    return "\n".join(out)


CSV_HEADER = ("dataset", "metric", "client", "method", "source", "mean", "std", "n", "seeds", "best", "ci95_low",
              "ci95_high")


def table_rows(table: Table) -> list[list[object]]:
    """Long-format rows (see CSV_HEADER); raw units (fractions for accuracy), empty std when undefined."""
    rows: list[list[object]] = []
    for t in table.datasets:
        for row in t.rows:
            best = t.best(row, table.lower_is_better)
            for col in t.columns:
                cell = t.cells.get((row, col))
                if cell is None:
                    continue
                rows.append([t.dataset, table.metric, row, col.removesuffix(PAPER) if cell.reference else col,
                             "paper" if cell.reference else "run", repr(cell.mean),
                             "" if math.isnan(cell.std) else repr(cell.std), cell.n, ";".join(map(str, cell.seeds)),
                             int(col in best), *_ci_fields(cell)])
    return rows


def _ci_fields(cell: Cell) -> list[str]:
    """The t-interval's bounds for the CSV; empty when undefined (n < 2, or a paper value)."""
    low, high = t_interval(cell.mean, cell.std, cell.n)
    return ["", ""] if cell.reference or math.isnan(low) else [repr(low), repr(high)]


def ci_line(table: DatasetTable, percent: bool, digits: int = 2) -> str:
    """'95% CI of the client average (t over seeds): fedavg 61.20 to 66.10; ...' ('' with one seed each)."""
    s = 100.0 if percent else 1.0
    parts = []
    for col in table.columns:
        cell = table.cells.get((AVG, col))
        if cell is None or cell.reference:
            continue
        low, high = t_interval(cell.mean, cell.std, cell.n)
        if not math.isnan(low):
            parts.append(f"{col} {low * s:.{digits}f} to {high * s:.{digits}f}")
    return f"95% CI of the client average (Student t over seeds): {'; '.join(parts)}.\n" if parts else ""


def to_csv(table: Table | Sequence[Table], path: str | os.PathLike[str]) -> Path:
    """Write one or more tables to `path` (long format, unformatted numbers) atomically."""
    tables = [table] if isinstance(table, Table) else list(table)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for t in tables:
        writer.writerows(table_rows(t))
    return atomic_write_text(path, buf.getvalue())
