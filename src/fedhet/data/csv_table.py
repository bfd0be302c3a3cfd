"""`csv`: your own tabular data, one CSV file (a column names each row's client) or a folder of CSVs (one per
client), read from `data.root`. The label column is `data.options.label`; the other columns are numeric features
or one-hot encoded categorical ones; missing values are an error or imputed (`ImputeStandardize` standardises
and imputes with each client's own training split). docs/data.md "Bring your own data" gives every rule.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedhet.data.files import DataFileError, is_junk
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset
from fedhet.errors import ConfigError, DatasetNotFoundError, nearest

if TYPE_CHECKING:
    from fedhet.config import DataConfig

MISSING = frozenset({"", "na", "n/a", "nan", "null", "none", "?"})
MISSING_POLICIES = ("error", "impute")


@dataclass
class CsvOptions:
    """`data.options` of dataset `csv`."""

    label: str = "label"  # the column holding each row's class
    client_column: str | None = None  # one file: the column naming each row's client (None: one client)
    features: list[str] | None = None  # the feature columns (None: every column but label / client / split)
    categorical: list[str] = field(default_factory=list)  # feature columns to one-hot encode
    missing: str = "error"  # error | impute (the mean of the client's training split; categorical: all zeros)
    split_column: str | None = None  # a column of train / test per row (None: seeded data.test_fraction hold-out)
    delimiter: str = ","  # the field separator

    def validate(self) -> None:
        if self.missing not in MISSING_POLICIES:
            raise ConfigError(f"data.options.missing must be one of {', '.join(MISSING_POLICIES)}"
                              f"{nearest(self.missing, MISSING_POLICIES)}, got '{self.missing}'")
        if len(self.delimiter) != 1:
            raise ConfigError(f"data.options.delimiter must be one character, got {self.delimiter!r}")


@dataclass
class Table:
    """All rows of the CSV file(s): column name -> values, plus each row's client and origin (file, line)."""

    columns: dict[str, list[str]]
    clients: list[str]
    origin: list[tuple[Path, int]]

    def where(self, row: int) -> str:
        path, line = self.origin[row]
        return f"{path} line {line}"

    def require(self, name: str, key: str) -> None:
        """Column `name`, named by option `key`, exists; else one ConfigError listing the columns."""
        if name not in self.columns:
            raise ConfigError(f"data.options.{key}: no column '{name}'{nearest(name, self.columns)}; "
                              f"columns: {', '.join(self.columns)}")

    def missing(self, name: str) -> list[int]:
        """The rows where column `name` has no value (empty, NA, ...: `MISSING`)."""
        return [i for i, v in enumerate(self.columns[name]) if v.lower() in MISSING]


def read_csv(path: Path, delimiter: str) -> tuple[list[str], list[list[str]], list[int]]:
    """(header, rows, line numbers) of one CSV file; ragged rows, bad encodings and empty files are errors."""
    try:
        text = path.read_text(encoding="utf-8-sig")
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    except (UnicodeDecodeError, csv.Error) as err:
        raise DataFileError(f"CSV file '{path}' cannot be read ({err}); save it as UTF-8 text") from err
    numbered = [(i + 1, r) for i, r in enumerate(rows) if any(c.strip() for c in r)]
    if len(numbered) < 2:
        raise DataFileError(f"CSV file '{path}' has no data rows (a header line and at least one row are needed)")
    header = [h.strip() for h in numbered[0][1]]
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes or not all(header):
        raise DataFileError(f"CSV file '{path}': the header has {'duplicate' if dupes else 'empty'} column names "
                            f"({', '.join(dupes) or 'an empty one'}); give every column a distinct name")
    for line, row in numbered[1:]:
        if len(row) != len(header):
            raise DataFileError(f"CSV file '{path}' line {line} has {len(row)} fields, the header {len(header)} "
                                f"(delimiter {delimiter!r}); fix the row or set data.options.delimiter")
    return header, [r for _, r in numbered[1:]], [line for line, _ in numbered[1:]]


def read_table(root: Path, opts: CsvOptions) -> Table:
    """One file (clients from `client_column`, or one client) or a folder of *.csv files (one client each)."""
    if root.is_dir():
        if opts.client_column is not None:
            raise ConfigError("data.options.client_column applies to a single CSV file; in a folder each file is "
                              "one client: remove client_column or point data.root at one file")
        files = sorted(p for p in root.iterdir() if p.suffix.lower() == ".csv" and p.is_file() and not is_junk(p))
        if not files:
            raise DatasetNotFoundError(f"dataset 'csv': folder '{root}' holds no .csv files (one per client)")
    elif root.is_file():
        files = [root]
    else:
        raise DatasetNotFoundError(f"dataset 'csv': data.root '{root}' does not exist; point it at a CSV file "
                                   "or a folder of CSV files (one per client)")
    table = Table({}, [], [])
    first: list[str] = []
    for path in files:
        header, rows, lines = read_csv(path, opts.delimiter)
        if not first:
            first, table.columns = header, {h: [] for h in header}
        elif sorted(header) != sorted(first):
            diff = sorted(set(header) ^ set(first))
            raise DataFileError(f"CSV file '{path}' has other columns than '{files[0]}' (differ: {', '.join(diff)}); "
                                "every client's file needs the same columns")
        for h, column in zip(header, zip(*rows, strict=True), strict=True):
            table.columns[h] += [v.strip() for v in column]
        table.origin += [(path, line) for line in lines]
        if opts.client_column is None:
            table.clients += [path.stem] * len(rows)
    if opts.client_column is not None:
        table.clients = column_values(table, opts.client_column, "client_column")
    return table


def column_values(table: Table, name: str, key: str) -> list[str]:
    """The values of a column named by option `key`; unknown names and missing values are errors."""
    table.require(name, key)
    if missing := table.missing(name):
        raise DataFileError(f"column '{name}' ({key}) has no value at {table.where(missing[0])}; every row needs one")
    return table.columns[name]


def numeric(table: Table, name: str, impute: bool) -> np.ndarray:
    """A numeric feature column as float32 (NaN where missing, with `impute`)."""
    out = np.full(len(table.clients), np.nan, np.float32)
    missing = table.missing(name)
    if missing and not impute:
        raise DataFileError(f"column '{name}' has a missing value at {table.where(missing[0])} ({len(missing)} in "
                            "all); fill it in, or set data.options.missing: impute (the client's training mean)")
    for i, v in enumerate(table.columns[name]):
        if v.lower() in MISSING:
            continue
        try:
            out[i] = float(v)
        except ValueError:
            raise DataFileError(f"column '{name}' holds the non-numeric value {v!r} at {table.where(i)}; list it "
                                "in data.options.categorical to one-hot encode it, or leave it out with "
                                "data.options.features") from None
        if not math.isfinite(out[i]):
            raise DataFileError(f"column '{name}' holds {v!r} at {table.where(i)}; features must be finite numbers")
    return out


def one_hot(table: Table, name: str, impute: bool) -> tuple[np.ndarray, list[str]]:
    """A categorical column one-hot encoded over its sorted values (all zeros where missing, with `impute`)."""
    values, missing = table.columns[name], table.missing(name)
    if missing and not impute:
        raise DataFileError(f"categorical column '{name}' has a missing value at {table.where(missing[0])} "
                            f"({len(missing)} in all); fill it in, or set data.options.missing: impute (all zeros)")
    cats = sorted({v for v in values if v.lower() not in MISSING})
    index = {c: j for j, c in enumerate(cats)}
    out = np.zeros((len(values), len(cats)), np.float32)
    for i, v in enumerate(values):
        if v in index:
            out[i, index[v]] = 1.0
    return out, [f"{name}={c}" for c in cats]


def _class_order(labels: list[str]) -> list[str]:
    """Distinct labels, numerically sorted when all are numbers, else alphabetically."""
    distinct = set(labels)
    try:
        return sorted(distinct, key=float)
    except ValueError:
        return sorted(distinct)


def _feature_columns(table: Table, opts: CsvOptions) -> list[str]:
    reserved = {opts.label, opts.client_column, opts.split_column}
    if opts.features is None:
        return [c for c in table.columns if c not in reserved]
    for name in opts.features:
        table.require(name, "features")
        if name in reserved:
            raise ConfigError(f"data.options.features lists '{name}', which is the label, client or split column")
    return list(opts.features)


def encode(table: Table, opts: CsvOptions) -> tuple[np.ndarray, list[str]]:
    """The feature matrix (N x D float32) and the name of each of its columns."""
    columns = _feature_columns(table, opts)
    for name in opts.categorical:
        if name not in columns:
            raise ConfigError(f"data.options.categorical: '{name}' is not a feature column"
                              f"{nearest(name, columns)}; feature columns: {', '.join(columns)}")
    if not columns:
        raise ConfigError("dataset 'csv' has no feature columns: the file holds only the label / client / split "
                          "columns")
    impute = opts.missing == "impute"
    blocks, names = [], []
    for name in columns:
        if name in opts.categorical:
            block, block_names = one_hot(table, name, impute)
        else:
            block, block_names = numeric(table, name, impute)[:, None], [name]
        blocks.append(block)
        names += block_names
    return np.concatenate(blocks, axis=1), names


def build_domains(table: Table, opts: CsvOptions) -> tuple[dict[str, DomainData], list[str], list[str]]:
    """(client -> DomainData, classes, feature names)."""
    labels = column_values(table, opts.label, "label")  # first: a wrong label name would look like a feature
    x, names = encode(table, opts)
    classes = _class_order(labels)
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[v] for v in labels], np.int64)
    split = None
    if opts.split_column is not None:
        split = np.array([v.lower() for v in column_values(table, opts.split_column, "split_column")])
        bad = [i for i, v in enumerate(split) if v not in ("train", "test")]
        if bad:
            value = table.columns[opts.split_column][bad[0]]
            raise DataFileError(f"column '{opts.split_column}' (split_column) holds {value!r} at "
                                f"{table.where(bad[0])}; its values must be train or test")
    clients = np.array(table.clients)
    out = {}
    for name in sorted(set(table.clients)):
        if not name or "/" in name or "\\" in name:
            raise DataFileError(f"client name {name!r} cannot name a client (empty, or holds a slash)")
        rows = clients == name
        tr = rows & (split == "train") if split is not None else rows
        te = rows & (split == "test") if split is not None else None
        if not tr.any() or (te is not None and not te.any()):
            raise DataFileError(f"client '{name}' has no {'training' if not tr.any() else 'test'} rows in column "
                                f"'{opts.split_column}'; give every client train and test rows")
        out[name] = DomainData(
            torch.from_numpy(x[tr]), torch.from_numpy(y[tr]),
            torch.from_numpy(x[te]) if te is not None else None, torch.from_numpy(y[te]) if te is not None else None,
            note=str(table.origin[int(np.flatnonzero(rows)[0])][0]))
    return out, classes, names


def resolve(spec: DatasetSpec, opts: CsvOptions, cfg: DataConfig) -> DatasetSpec:
    """The concrete spec: clients, classes and features read from the CSV file(s) at `data.root`."""
    if not cfg.root:
        raise ConfigError("dataset 'csv' reads data.root: set it to a CSV file (with data.options.client_column) "
                          "or a folder holding one CSV file per client")
    table = read_table(Path(cfg.root).expanduser(), opts)
    domains, classes, names = build_domains(table, opts)
    return dataclasses.replace(spec, domains=tuple(domains), classes=tuple(classes),
                               loader=lambda ctx, domain: domains[domain],
                               feature_dim=len(names), resolve=None)


def _unresolved(ctx: LoadContext, domain: str) -> DomainData:
    raise ConfigError("dataset 'csv' must be resolved first: use fedhet.data.registry.resolve_spec(cfg)")


register_dataset(DatasetSpec(
    name="csv", domains=(), classes=(), modality="features", loader=_unresolved,
    source="your own table (docs/data.md, 'Bring your own data')",
    layout="data.root = <file>.csv (data.options.client_column names the client) or <folder>/<client>.csv",
    feature_norm="impute_standardize", options=CsvOptions, resolve=resolve,
))
