"""Data layer: domain datasets, client partitions, per-sample transforms and a federated view of them.

`build_federated_data(cfg.data, seed)` is the entry point; see docs/data.md. Your own data: the datasets
`imagefolder` and `csv`, or `register_dataset(DatasetSpec(...))` in a module a config lists under `imports`.
"""

from fedhet.data.datasets import IndexedDataset, Part
from fedhet.data.federated import PARTITIONS, ClientData, FederatedData, build_federated_data
from fedhet.data.files import DataFileError
from fedhet.data.registry import (
    DATASETS,
    DatasetInfo,
    DatasetSpec,
    DomainData,
    LoadContext,
    dataset_info,
    list_datasets,
    register_dataset,
    resolve_spec,
)
from fedhet.data.show import describe, plot_partition

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "ClientData",
    "DataFileError",
    "DatasetInfo",
    "DatasetSpec",
    "DomainData",
    "FederatedData",
    "IndexedDataset",
    "LoadContext",
    "Part",
    "build_federated_data",
    "dataset_info",
    "describe",
    "list_datasets",
    "plot_partition",
    "register_dataset",
    "resolve_spec",
]
