"""Whether a registered dataset is on this machine, for `fedhet data list`: a cheap look at the folders its
layout names under the data root (nothing is loaded or decoded), the packages built-in data comes from, and
the domains fedhet can generate."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from fedhet.data.registry import DatasetSpec

# built-in datasets that read a package (name -> (module, the extra that installs it))
PACKAGES = {"easy_vqa": ("easy_vqa", "vlm")}
EXTRA_FOLDERS = {"fashion_mnist": (Path("/usr/share/datasets/fashion-mnist"),)}  # Debian's dataset-fashion-mnist


def _folders(layout: str) -> list[str]:
    """The top-level folder names a layout string mentions: 'digits/<domain>.npz (...)' -> ['digits']."""
    return list(dict.fromkeys(m.group(1) for m in re.finditer(r"(?:^|[\s(])([A-Za-z0-9_.-]+)/", layout)))


def presence(spec: DatasetSpec, root: Path | None) -> str:
    """One line: built in / present (where) / missing (where it was looked for)."""
    if spec.builtin:
        for prefix, (module, extra) in PACKAGES.items():
            if spec.name.startswith(prefix) and importlib.util.find_spec(module) is None:
                return f"not installed: pip install 'fedhet[{extra}]'"
        return "built in"
    if spec.layout.startswith("data.root ="):
        return "your own data: point data.root at it"
    candidates = [root / f for f in _folders(spec.layout)] if root is not None else []
    candidates += list(EXTRA_FOLDERS.get(spec.name, ()))
    found = [p for p in candidates if p.exists()]
    if found:
        return f"present: {found[0]}"
    generated = f" (generated without files: {', '.join(spec.generated_domains)})" if spec.generated_domains else ""
    if root is None:
        return f"missing: no data root (set FEDHET_DATA or data.root){generated}"
    return f"missing under {root}{generated}"
