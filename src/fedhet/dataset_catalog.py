"""The registered datasets as `fedhet data list` shows them, from a catalog shipped beside this module
(datasets.json), so the listing imports neither torch nor the loaders; and whether each is on this machine.

    python -m fedhet.dataset_catalog --write    # regenerate datasets.json after registering a dataset
    python -m fedhet.dataset_catalog --check    # exit 1 when it differs from the registry

tests/data/test_presence.py fails when the catalog and the live registry disagree. Presence is a cheap look at
the folders a dataset's layout names under the data root (nothing is loaded), at the packages built-in data
comes from, and at the domains fedhet can generate.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

CATALOG = Path(__file__).with_name("datasets.json")
PACKAGES = {"easy_vqa": ("easy_vqa", "vlm")}  # built-in datasets read from a package: (module, its extra)


def render_catalog() -> list[dict[str, Any]]:  # Any: JSON entries
    """The catalog of fedhet's own datasets from the live registry (imports every loader)."""
    from fedhet.data import dataset_info, list_datasets
    from fedhet.data.fashion_mnist import DEBIAN_DIR
    from fedhet.data.registry import get_spec

    outside_root = {"fashion_mnist": [str(DEBIAN_DIR)]}  # where a loader also looks (Debian's package)

    out = []
    for name in list_datasets():
        loader = get_spec(name).loader
        if not getattr(getattr(loader, "func", loader), "__module__", "").startswith("fedhet."):
            continue  # a plug-in's (imports:), not fedhet's (a functools.partial names its function)
        info = dataset_info(name)
        out.append({"name": name, "text": str(info), "layout": info.layout, "builtin": info.builtin,
                    "generated": list(info.generated_domains), "outside_root": outside_root.get(name, [])})
    return out


def load_catalog() -> list[dict[str, Any]]:  # Any: parsed JSON
    entries: list[dict[str, Any]] = json.loads(  # Any: parsed JSON
        CATALOG.read_text(encoding="utf-8"))
    return entries


def _folders(layout: str) -> list[str]:
    """The top-level folder names a layout string mentions: 'digits/<domain>.npz (...)' -> ['digits']."""
    return list(dict.fromkeys(m.group(1) for m in re.finditer(r"(?:^|[\s(])([A-Za-z0-9_.-]+)/", layout)))


def presence(entry: dict[str, Any], root: Path | None) -> str:  # Any: a JSON entry
    """One line: built in / present (where) / missing (where it was looked for)."""
    name, layout = str(entry["name"]), str(entry["layout"])
    if entry["builtin"]:
        for prefix, (module, extra) in PACKAGES.items():
            if name.startswith(prefix) and importlib.util.find_spec(module) is None:
                return f"not installed: pip install 'fedhet[{extra}]'"
        return "built in"
    if layout.startswith("data.root ="):
        return "your own data: point data.root at it"
    candidates = [root / f for f in _folders(layout)] if root is not None else []
    candidates += [Path(p) for p in entry.get("outside_root", [])]
    found = [p for p in candidates if p.exists()]
    if found:
        return f"present: {found[0]}"
    generated = f" (generated without files: {', '.join(entry['generated'])})" if entry["generated"] else ""
    if root is None:
        return f"missing: no data root (set FEDHET_DATA or data.root){generated}"
    return f"missing under {root}{generated}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = json.dumps(render_catalog(), indent=1) + "\n"
    if args.write:
        CATALOG.write_text(text, encoding="utf-8")
        return 0
    same = CATALOG.is_file() and CATALOG.read_text(encoding="utf-8") == text
    print("datasets.json is up to date" if same else "datasets.json differs: python -m fedhet.dataset_catalog --write")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
