"""Human-readable views of a federated split: a text table and a stacked-bar PNG (used by `fedhet data show`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedhet.config.sections import DataConfig
from fedhet.outpaths import check_plot_file, write_failed

if TYPE_CHECKING:
    from fedhet.data.federated import FederatedData


def split_labels(ds: object) -> np.ndarray:
    """Labels of a client split (IndexedDataset.labels, else by iterating)."""
    if ds is None:
        return np.zeros(0, np.int64)
    labels = getattr(ds, "labels", None)
    if labels is not None:
        return np.asarray(labels)
    return np.array([int(ds[i][1]) for i in range(len(ds))], dtype=np.int64)  # type: ignore[index, arg-type]


def class_counts(fed: FederatedData, split: str = "train") -> np.ndarray:
    """num_clients x num_classes counts of a split ("train", "val" or "test")."""
    rows = [np.bincount(split_labels(getattr(c, split)), minlength=fed.num_classes) for c in fed.clients]
    return np.stack(rows) if rows else np.zeros((0, fed.num_classes), np.int64)


def _hist(counts: np.ndarray) -> str:
    if len(counts) <= 20:
        return " ".join(str(int(v)) for v in counts)
    nz = counts[counts > 0]
    return f"{len(nz)}/{len(counts)} classes, per class min {nz.min() if len(nz) else 0} max {counts.max()}"


def describe(fed: FederatedData) -> str:
    """Table of clients: name, domain, #train/#val/#test and the training class histogram."""
    lines = [f"dataset {fed.dataset}: {len(fed.clients)} clients, {fed.num_classes} classes, "
             f"input {fed.input_shape}, partition {fed.partition}"]
    if len(fed.classes) <= 20:
        lines.append("classes: " + ", ".join(fed.classes))
    for d in fed.generated_domains:
        lines.append(f"note: domain '{d}' is GENERATED ({fed.notes.get(d, 'synthetic')}), not real data")
    train, test = class_counts(fed, "train"), class_counts(fed, "test")
    val = [len(c.val) if c.val is not None else 0 for c in fed.clients]  # type: ignore[arg-type]
    header = ("client", "domain", "#train", "#val", "#test", "train class histogram")
    rows = [(c.name, c.domain, str(int(train[i].sum())), str(val[i]), str(int(test[i].sum())), _hist(train[i]))
            for i, c in enumerate(fed.clients)]
    rows.append(("total", "", str(int(train.sum())), str(sum(val)), str(int(test.sum())), _hist(train.sum(0))))
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(5)]
    for r in [header, *rows]:
        cells = [v.ljust(w) if j < 2 else v.rjust(w) for j, (v, w) in enumerate(zip(r[:5], widths, strict=True))]
        lines.append("  ".join(cells) + "  " + r[5])
    lines += [f"classes of {c.name} (its head's pool): {', '.join(fed.classes[k] for k in c.classes)}"
              for c in fed.clients if c.classes is not None]
    return "\n".join(lines)


PARTITION_KEYS = {"domain": ("clients_per_domain",), "dirichlet": ("num_clients", "alpha"),
                  "pathological": ("num_clients", "classes_per_client"),
                  "pathological_uniform": ("num_clients", "classes_per_client", "pathological_low",
                                           "pathological_high"),
                  "pachinko": ("num_clients", "pachinko_alpha", "pachinko_beta"),
                  "quantity": ("num_clients", "quantity_alpha"), "iid": ("num_clients",)}
SIZE_KEYS = ("fraction", "max_train_per_client", "val_fraction", "max_test_per_client")


def partition_label(data: DataConfig, seed: int) -> str:
    """The partition and the parameters that shape it, e.g. "dirichlet (num_clients=10, alpha=0.1), seed 0"."""
    defaults = DataConfig()
    keys = [*PARTITION_KEYS.get(data.partition, ()),
            *(k for k in SIZE_KEYS if getattr(data, k) != getattr(defaults, k))]
    return f"{data.partition} ({', '.join(f'{k}={getattr(data, k)}' for k in keys)}), seed {seed}"


def plot_partition(fed: FederatedData, path: str | Path, split: str = "train", label: str | None = None) -> Path:
    """Write a PNG with one stacked bar of class counts per client; returns the path. `label` (default: the
    partition's name) names the partition's parameters in the title (`partition_label`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = class_counts(fed, split)
    names = [c.name for c in fed.clients]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(names) + 2), 4))
    cmap = plt.get_cmap("tab20" if fed.num_classes > 10 else "tab10")
    bottom = np.zeros(len(names))
    for k in range(fed.num_classes):
        ax.bar(names, counts[:, k], bottom=bottom, color=cmap(k % cmap.N), label=fed.classes[k])
        bottom += counts[:, k]
    ax.set_ylabel(f"#{split} samples")
    title = f"{fed.dataset}: {label or fed.partition + ' partition'}"
    if fed.generated_domains:
        title += f" (generated: {', '.join(fed.generated_domains)})"
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", rotation=45)
    if fed.num_classes <= 20:
        ax.legend(fontsize=7, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    path = check_plot_file(Path(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as err:
        raise write_failed(path, err, "--plot") from err
    finally:
        plt.close(fig)
    return path
