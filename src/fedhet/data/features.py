"""Feature-vector domain datasets: Office-Caltech10 SURF histograms (Fed-Heart-Disease: `heart_disease.py`).

Features are held raw (float32) in memory; normalisation is a per-sample transform (SURF) or fitted on each
client's own training split (heart disease), see `fedhet.data.transforms`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedhet.data.files import missing_dataset, open_npz
from fedhet.data.heart_disease import (  # noqa: F401  (registers heart_disease)
    HEART_FEATURES,
    HEART_SRC,
    load_heart_domain,
    parse_heart_csv,
)
from fedhet.data.images import OFFICE_CALTECH_CLASSES
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, register_dataset

SURF_SRC = ("Gong et al., CVPR 2012 (GFK SURF_L10 features: https://github.com/jindongwang/transferlearning/"
            "tree/master/data, files <domain>_SURF_L10.mat)")


def load_surf_domain(ctx: LoadContext, domain: str) -> DomainData:
    """800-bin SURF histograms from `<root>/office_caltech10_surf/<domain>.npz` or the original .mat file."""
    looked: list[Path] = []
    if ctx.root is not None:
        base = ctx.root / "office_caltech10_surf"
        npz = base / f"{domain}.npz"
        looked.append(npz)
        if npz.is_file():
            with open_npz(npz) as z:
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


register_dataset(DatasetSpec(
    name="office_caltech10_surf", domains=("amazon", "caltech", "dslr", "webcam"),
    classes=OFFICE_CALTECH_CLASSES, modality="features", loader=load_surf_domain, source=SURF_SRC,
    layout="office_caltech10_surf/<domain>.npz (x Nx800 counts, y) or <Domain>_SURF_L10.mat (fts, labels)",
    feature_norm="log_l2", feature_dim=800,
))
