"""Reporting: load run directories, tabulate final metrics (mean ± std over seeds), plot learning curves."""

from fedhet.report.plot import curve_stats, plot_curves
from fedhet.report.report import ReportPaths, write_report
from fedhet.report.runs import MetricRow, RunRecord, find_run_dirs, is_run_dir, load_run, load_runs
from fedhet.report.stats import mean_std
from fedhet.report.table import Cell, DatasetTable, Table, make_table, to_csv, to_markdown
from fedhet.report.tuned import TunedRow, tuned_rows, tuned_section

__all__ = [
    "Cell",
    "DatasetTable",
    "MetricRow",
    "ReportPaths",
    "RunRecord",
    "Table",
    "TunedRow",
    "curve_stats",
    "find_run_dirs",
    "is_run_dir",
    "load_run",
    "load_runs",
    "make_table",
    "mean_std",
    "plot_curves",
    "to_csv",
    "to_markdown",
    "tuned_rows",
    "tuned_section",
    "write_report",
]
