"""Feature-vector domain datasets: Office-Caltech10 SURF histograms and Fed-Heart-Disease (UCI, 4 hospitals).

Features are held raw (float32) in memory; normalisation is a per-sample transform (SURF) or fitted on each
client's own training split (heart disease), see `fedhet.data.transforms`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedhet.data.files import missing_dataset
from fedhet.data.images import OFFICE_CALTECH_CLASSES
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset

SURF_SRC = ("Gong et al., CVPR 2012 (GFK SURF_L10 features: https://github.com/jindongwang/transferlearning/"
            "tree/master/data, files <domain>_SURF_L10.mat)")
HEART_SRC = ("UCI Heart Disease (Janosi et al. 1988), https://archive.ics.uci.edu/dataset/45/heart+disease "
             "(files processed.<hospital>.data); FLamby's Fed-Heart-Disease: https://github.com/owkin/FLamby")
HEART_FEATURES = ("age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak",
                  "slope", "ca", "thal")


def load_surf_domain(ctx: LoadContext, domain: str) -> DomainData:
    """800-bin SURF histograms from `<root>/office_caltech10_surf/<domain>.npz` or the original .mat file."""
    looked: list[Path] = []
    if ctx.root is not None:
        base = ctx.root / "office_caltech10_surf"
        npz = base / f"{domain}.npz"
        looked.append(npz)
        if npz.is_file():
            with np.load(npz) as z:
                x, y = z["x"].astype(np.float32), z["y"].astype(np.int64)
            return DomainData(torch.from_numpy(x), torch.from_numpy(y), note=str(npz))
        mat_name = "Caltech10" if domain == "caltech" else domain
        for folder in (base, base / "original_mat"):
            for name in (f"{mat_name}_SURF_L10.mat", f"{domain}_SURF_L10.mat"):
                mat = folder / name
                looked.append(mat)
                if mat.is_file():
                    from scipy.io import loadmat

                    m = loadmat(str(mat))
                    x = np.asarray(m["fts"], dtype=np.float32)
                    y = np.asarray(m["labels"], dtype=np.int64).reshape(-1) - 1  # 1..10 -> 0..9
                    return DomainData(torch.from_numpy(x), torch.from_numpy(y), note=str(mat))
    raise missing_dataset("office_caltech10_surf", domain, ctx.root, list(dict.fromkeys(looked)), SURF_SRC,
                          f"office_caltech10_surf/{domain}.npz or office_caltech10_surf/<Domain>_SURF_L10.mat")


def parse_heart_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A processed.<hospital>.data file -> (N x 13 float32 with NaN for '?', binary labels num > 0)."""
    rows = [line.strip().split(",") for line in path.read_text().splitlines() if line.strip()]
    arr = np.array([[np.nan if v.strip() == "?" else float(v) for v in r] for r in rows], dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != 14:
        raise ValueError(f"{path}: expected 14 comma-separated columns, got shape {arr.shape}")
    return arr[:, :13], (arr[:, 13] > 0).astype(np.int64)


def load_heart_domain(ctx: LoadContext, domain: str) -> DomainData:
    """One hospital of Fed-Heart-Disease from `<root>/uci_heart_disease/processed.<domain>.data`."""
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


register_dataset(DatasetSpec(
    name="office_caltech10_surf", domains=("amazon", "caltech", "dslr", "webcam"),
    classes=OFFICE_CALTECH_CLASSES, modality="features", loader=load_surf_domain, source=SURF_SRC,
    layout="office_caltech10_surf/<domain>.npz (x Nx800 counts, y) or <Domain>_SURF_L10.mat (fts, labels)",
    feature_norm="log_l2", feature_dim=800,
))
register_dataset(DatasetSpec(
    name="heart_disease", domains=("cleveland", "hungarian", "switzerland", "va"), classes=("absent", "present"),
    modality="features", loader=load_heart_domain, source=HEART_SRC,
    layout="uci_heart_disease/processed.<hospital>.data", feature_norm="impute_standardize", feature_dim=13,
))
