"""Rebuild a model from a `fedhet export` folder: `fedhet.load_exported(folder, client=NAME)`.

The architecture comes from model.json (the registered model's name and args, num_classes, input_shape, and the
plug-in `imports` that register it), the weights from the client's file named in export.json, loaded with
`torch.load(weights_only=True)`: nothing in the folder is executed. Only torch and fedhet.models are needed,
not the run directory nor its data.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from fedhet.errors import FedhetError
from fedhet.yaml_input import JSONDict

EXPORT_FILE = "export.json"
MODEL_FILE = "model.json"
GLOBAL_FILE = "global.pt"


def _read_json(path: Path) -> JSONDict:
    if not path.is_file():
        raise FedhetError(f"'{path.parent}' is not a fedhet export folder (no {path.name}); give the folder "
                          "`fedhet export` wrote")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise FedhetError(f"'{path}' is not an export's {path.name} (not a JSON object)")
    return data


def exported_file(folder: str | Path, client: str | None = None) -> Path:
    """The weights file of `client` (None: the global model) in an export folder; an unknown name or a method
    without a global model is one FedhetError listing what the folder holds."""
    folder = Path(folder)
    manifest = _read_json(folder / EXPORT_FILE)
    clients: JSONDict = manifest.get("clients", {})
    if client is None:
        file = (manifest.get("global") or {}).get("file")
        if not file:
            raise FedhetError(f"the export '{folder}' has no global model ({manifest.get('method')}: "
                              f"{(manifest.get('global') or {}).get('note', '')}); pick a client: "
                              f"{', '.join(clients) or '(none)'}")
        return folder / str(file)
    if client not in clients:
        raise FedhetError(f"the export '{folder}' holds no client '{client}'; its clients are "
                          f"{', '.join(clients) or '(none)'}")
    return folder / str(clients[client]["file"])


def build_exported(folder: str | Path) -> nn.Module:
    """The export's architecture, freshly built from model.json (weights not loaded)."""
    from fedhet.models import build_model
    from fedhet.plugins import import_plugins

    spec = _read_json(Path(folder) / MODEL_FILE)
    import_plugins(list(spec.get("imports", [])))
    return build_model(spec["model"], int(spec["num_classes"]), tuple(spec["input_shape"]), pretrained=False,
                       vocabulary=tuple(spec.get("vocabulary", ())), **spec.get("args", {}))


def load_exported(folder: str | Path, client: str | None = None, device: str | torch.device = "cpu") -> nn.Module:
    """The model `fedhet export` wrote for `client` (by name; None: the global model), rebuilt and loaded, in
    eval mode on `device`: `fedhet.load_exported("runs/.../export", client="clean")(x).argmax(1)`."""
    path = exported_file(folder, client)
    model = build_exported(folder)
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()
