"""Keep tests light on the shared CPU; make `src/` importable when fedhet is not installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

if importlib.util.find_spec("fedhet") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

torch.set_num_threads(1)
