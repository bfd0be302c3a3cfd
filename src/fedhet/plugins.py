"""User plugins: the modules a config lists under `imports`, imported before any name is looked up.

A plugin registers datasets (`fedhet.data.register_dataset`), models (`fedhet.models.register_model`) or
methods (`fedhet.algorithms.register`) at import time, into the registries fedhet's own entries use
(`fedhet.registry`: built-ins are imported on first use); after each plugin the built-ins of every registry are
loaded, so a plugin that takes a built-in's name is an error naming it. An entry is either a dotted module name
(`my_pkg.my_datasets`, imported from `sys.path` with the current directory in front, as `python -m` does) or
the path of a `.py` file (`./my_datasets.py`). A relative path written in a config file is looked up in that
file's folder first (`anchor_imports`, when the file is read: in an `extends` chain, the file that wrote the
key), then in the current directory; one given on the command line or in code, in the current directory. Each
is imported once per process. See docs/data.md "Registering a dataset in code".
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType

from fedhet.errors import ConfigError
from fedhet.registry import load_builtins

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _is_path(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def anchor_imports(entries: object, folder: Path) -> object:
    """`entries` (a config file's `imports`) with each relative `.py` path that names a file in `folder` (the
    config file's own) made absolute; other entries, and anything not a list, unchanged (checked later)."""
    if not isinstance(entries, list):
        return entries
    return [_anchored(e, folder) if isinstance(e, str) else e for e in entries]


def _anchored(entry: str, folder: Path) -> str:
    path = Path(entry.strip())
    if not _is_path(entry.strip()) or path.expanduser().is_absolute() or not (folder / path).is_file():
        return entry  # a module name, an absolute path, or a file the current directory may hold
    return str((folder / path).resolve())


def _where(err: BaseException, path: Path | None) -> str:
    """' (at FILE:LINE)' of the deepest frame of the traceback inside `path` (or the deepest frame at all)."""
    frames = list(traceback.extract_tb(err.__traceback__))
    if path is not None:
        frames = [f for f in frames if Path(f.filename).resolve() == path] or frames
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _failed(entry: str, err: BaseException, path: Path | None = None) -> ConfigError:
    return ConfigError(f"imports: importing '{entry}' failed with {type(err).__name__}: {err}{_where(err, path)}; "
                       "fix the module (run with -v for the traceback) or remove it from imports")


def _import_file(entry: str) -> ModuleType:
    path = Path(entry).expanduser()
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if path.suffix != ".py":
        raise ConfigError(f"imports: '{entry}' is a path but not a .py file; list a Python file or a module name")
    if not path.is_file():
        raise ConfigError(f"imports: file '{path}' not found (a relative path is looked up in the folder of the "
                          f"config file that lists it, then in the current directory, {Path.cwd()}); fix the path "
                          "or use an absolute one")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"fedhet_plugin_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-.py suffixes, excluded above
        raise ConfigError(f"imports: cannot import '{path}' as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any failure in user code becomes one clear error
        del sys.modules[name]
        raise _failed(entry, err, path) from err
    return module


def _import_name(entry: str) -> ModuleType:
    if not _MODULE_NAME.fullmatch(entry):
        raise ConfigError(f"imports: '{entry}' is neither a module name (like my_pkg.my_datasets) nor a .py file")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(entry)
    except ModuleNotFoundError as err:
        if err.name is not None and (entry == err.name or entry.startswith(f"{err.name}.")):
            raise ConfigError(f"imports: no module named '{entry}' (looked on sys.path and in {cwd}); install "
                              "it, add its folder to PYTHONPATH, or give the path of its .py file") from err
        raise _failed(entry, err) from err
    except Exception as err:  # noqa: BLE001 - any failure in user code becomes one clear error
        raise _failed(entry, err) from err
    finally:
        if added:
            sys.path.remove(cwd)


def import_plugins(entries: list[str]) -> list[ModuleType]:
    """Import each entry (dotted module name or .py path) once; any failure is a ConfigError naming it."""
    modules = []
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(f"imports: entries must be module names or .py paths, got {entry!r}")
        entry = entry.strip()
        modules.append(_import_file(entry) if _is_path(entry) else _import_name(entry))
        try:
            load_builtins()  # a plug-in that took a built-in's name: "registered twice", naming the entry
        except ValueError as err:
            raise _failed(entry, err) from err
    return modules
