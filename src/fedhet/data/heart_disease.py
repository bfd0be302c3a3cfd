"""Fed-Heart-Disease: the four UCI heart-disease hospitals as clients, by default as FLamby prepares them.

FLamby (Ogier du Terrail et al., NeurIPS 2022 Datasets & Benchmarks; `flamby/datasets/fed_heart_disease`), the
standard federated version (FL4Health, the Ditto + MMD paper's code base, has Ditto scripts for it): drop `slope`,
`ca` and `thal` (mostly missing outside Cleveland), drop every row that still has a missing value (740 of 920
rows), one-hot encode `cp` (1-4) and `restecg` (0-2) dropping the first level, label `num > 0`, and one fixed
train/test split per hospital for every seed: scikit-learn's
`train_test_split(train_size=0.66, random_state=43)`, stratified by the label when both classes have more than
two rows, which gives 199/104, 172/89, 30/16 and 85/45 rows (Cleveland, Hungarian, Switzerland, VA).

`data.heart_preprocessing: uci13` keeps fedhet's earlier version instead: all 920 rows and 13 columns, missing
values left as NaN (mean-imputed by the client's normaliser) and the seeded `test_fraction` split.
In both, features are standardised with the client's own training mean / std (`ImputeStandardize`), as FLamby
normalises each centre with its training statistics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedhet.data.files import missing_dataset
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset
from fedhet.errors import ConfigError, FedhetError

HEART_SRC = ("UCI Heart Disease (Janosi et al. 1988), https://archive.ics.uci.edu/dataset/45/heart+disease "
             "(files processed.<hospital>.data); FLamby's Fed-Heart-Disease: https://github.com/owkin/FLamby")
HEART_FEATURES = ("age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak",
                  "slope", "ca", "thal")
FLAMBY_DROPPED = ("slope", "ca", "thal")
FLAMBY_ONE_HOT = {"cp": (1.0, 2.0, 3.0, 4.0), "restecg": (0.0, 1.0, 2.0)}  # levels; the first is dropped
FLAMBY_FEATURES = ("age", "sex", "trestbps", "chol", "fbs", "thalach", "exang", "oldpeak",
                   "cp_2", "cp_3", "cp_4", "restecg_1", "restecg_2")  # FLamby's column order (dummies last)
FLAMBY_TRAIN, FLAMBY_SEED = 0.66, 43
PREPROCESSINGS = ("flamby", "uci13")


def parse_heart_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A processed.<hospital>.data file -> (N x 13 float32 with NaN for '?', binary labels num > 0)."""
    rows = [line.strip().split(",") for line in path.read_text().splitlines() if line.strip()]
    try:
        arr = np.array([[np.nan if v.strip() == "?" else float(v) for v in r] for r in rows], dtype=np.float32)
    except ValueError as e:
        raise FedhetError(f"{path}: not a UCI heart-disease file ({e}); expected 14 comma-separated numbers "
                          "per row, '?' for missing") from None
    if arr.ndim != 2 or arr.shape[1] != 14:
        raise FedhetError(f"{path}: expected 14 comma-separated columns per row, got shape {arr.shape}")
    return arr[:, :13], (arr[:, 13] > 0).astype(np.int64)


def load_heart_domain(ctx: LoadContext, domain: str) -> DomainData:
    """One hospital, all rows and 13 columns (NaN = missing), from `<root>/uci_heart_disease/processed.<h>.data`."""
    looked: list[Path] = []
    if ctx.root is not None:
        for folder in ("uci_heart_disease", "heart_disease", "fed_heart_disease"):
            path = ctx.root / folder / f"processed.{domain}.data"
            looked.append(path)
            if path.is_file():
                x, y = parse_heart_csv(path)
                return DomainData(torch.from_numpy(x), torch.from_numpy(y), note=str(path))
    raise missing_dataset("heart_disease", domain, ctx.root, looked, HEART_SRC,
                          f"uci_heart_disease/processed.{domain}.data")


def flamby_features(x: np.ndarray, where: str) -> np.ndarray:
    """N x 13 UCI columns without missing values -> N x 13 FLamby columns (3 dropped, cp / restecg one-hot)."""
    keep = [i for i, f in enumerate(HEART_FEATURES) if f not in FLAMBY_DROPPED and f not in FLAMBY_ONE_HOT]
    dummies = []
    for name, levels in FLAMBY_ONE_HOT.items():
        col = x[:, HEART_FEATURES.index(name)]
        unknown = sorted(set(col.tolist()) - set(levels))
        if unknown:
            raise FedhetError(f"{where}: column '{name}' holds {unknown}, outside its UCI levels {list(levels)}; "
                              "fix the file or use data.heart_preprocessing: uci13")
        dummies += [(col == level).astype(np.float32) for level in levels[1:]]
    return np.column_stack([x[:, keep], *dummies]).astype(np.float32)


def flamby_split(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FLamby's fixed per-hospital (train, test) row indices: 66/34, seed 43, stratified when it can be."""
    from sklearn.model_selection import train_test_split

    levels, counts = np.unique(y, return_counts=True)
    stratify = y if len(levels) > 1 and (counts > 2).all() else None
    train, test = train_test_split(np.arange(len(y)), test_size=1.0 - FLAMBY_TRAIN, train_size=FLAMBY_TRAIN,
                                   random_state=FLAMBY_SEED, shuffle=True, stratify=stratify)
    return np.sort(train), np.sort(test)


def flamby_domain(d: DomainData, name: str) -> DomainData:
    """One hospital as FLamby prepares it, from the raw 13-column form `load_heart_domain` returns."""
    if d.x_test is not None:
        raise FedhetError(f"heart_disease '{name}' already has a test split; FLamby's split needs the raw rows")
    x, y = d.x_train.numpy(), d.y_train.numpy()
    dropped = [HEART_FEATURES.index(f) for f in FLAMBY_DROPPED]
    complete = ~np.isnan(np.delete(x, dropped, axis=1)).any(axis=1)
    x, y = flamby_features(x[complete], d.note or name), y[complete]
    if len(y) < 3:
        raise FedhetError(f"heart_disease '{name}': {len(y)} complete rows ({d.note}); FLamby's split needs >= 3")
    train, test = flamby_split(y)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    note = f"{d.note}; FLamby: {len(y)} complete rows, {len(train)} train / {len(test)} test"
    return DomainData(xt[train], yt[train], xt[test], yt[test], note=note)


def heart_protocol(preprocessing: str, dataset: str) -> bool:
    """Whether FLamby's preprocessing applies; a ConfigError for an unknown or misplaced value."""
    if preprocessing not in PREPROCESSINGS:
        raise ConfigError(f"data.heart_preprocessing must be one of {', '.join(PREPROCESSINGS)}, "
                          f"got '{preprocessing}'")
    if dataset != "heart_disease" and preprocessing != "flamby":
        raise ConfigError(f"data.heart_preprocessing applies to dataset 'heart_disease' only, not '{dataset}'; "
                          "remove it")
    return dataset == "heart_disease" and preprocessing == "flamby"


register_dataset(DatasetSpec(
    name="heart_disease", domains=("cleveland", "hungarian", "switzerland", "va"), classes=("absent", "present"),
    modality="features", loader=load_heart_domain, source=HEART_SRC,
    layout="uci_heart_disease/processed.<hospital>.data", feature_norm="impute_standardize", feature_dim=13,
))
