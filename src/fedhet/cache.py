"""fedhet's cache folder on this machine (decoded easy-VQA images, FedBiP's generated images)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$FEDHET_CACHE, else $XDG_CACHE_HOME/fedhet, else ~/.cache/fedhet."""
    base = os.environ.get("FEDHET_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fedhet")
    return Path(base)
