"""What a generated Flower App needs to run on machines other than this one, checked when it is written.

- Plug-in code: the `.py` files a config lists under `imports` (datasets, models, methods, see fedhet.plugins)
  are copied into the App folder as the package `fedhet_plugins_<hash>` and the config imports them from there
  by module name. Flower ships every `.py` file of the App (the FAB) and puts the App's folder on `sys.path` of
  the ServerApp and ClientApp processes; a fedhet worker beside a SuperNode is told that folder by the lean
  ClientApp (`node_app.APP_DIR_KEY`). Dotted module names stay as they are: install them on every machine. A
  worker keeps what it imported: restart it to use a changed plug-in (a second copy would register its names
  twice).
- Paths: a relative path in the config (`data.root`, any `*.root`, `model.init_from`) would be resolved by each
  SuperLink / SuperNode against its own working folder; it is refused with what to give instead.
- `flwr run --run-config` keys: the SuperLink refuses a key the App does not list with only
  "[code: 15] Invalid run configuration." (the key is in the SuperLink's log); `check_overrides` names it and
  the nearest valid key before the run is submitted
  (`python -m fedhet.runtimes.flower.app_checks APP --run-config "train.lr=0.05"`).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
from pathlib import Path

import tomli

from fedhet.config import flatten
from fedhet.errors import ConfigError, FedhetError, nearest
from fedhet.yaml_input import JSONDict

PLUGIN_PREFIX = "fedhet_plugins_"  # the package of an App's copied plug-in files (node_app.py repeats it)
PATH_KEYS = ("root", "init_from")  # config keys (last dotted part) that hold a file or folder path


def copy_plugins(folder: Path, config: JSONDict) -> JSONDict:
    """Copy the `.py` files of `config["imports"]` into `folder/fedhet_plugins_<hash>/`; the config importing
    them from there by module name (the other entries unchanged)."""
    from fedhet.plugins import _is_path  # the same rule the importer uses

    entries = [str(e).strip() for e in config.get("imports") or []]
    files = [Path(e).expanduser().resolve() for e in entries if _is_path(e)]
    if not files:
        return config
    for path in files:
        if not path.is_file():
            raise ConfigError(f"imports: file '{path}' not found; fix the path before writing the Flower App")
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()[:10]
    package = folder / f"{PLUGIN_PREFIX}{digest}"
    for old in folder.glob(f"{PLUGIN_PREFIX}*"):
        shutil.rmtree(old)
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""fedhet plug-ins of this Flower App (copied by write_flower_app)."""\n')
    names: dict[Path, str] = {}
    for path in files:
        stem = re.sub(r"\W", "_", path.stem)
        stem = stem if stem[:1].isalpha() else f"m_{stem}"
        if stem in names.values():
            raise ConfigError(f"imports: two files are named {path.stem}.py; rename one of them")
        names[path] = stem
        shutil.copyfile(path, package / f"{stem}.py")
    renamed = iter(f"{package.name}.{names[p]}" for p in files)
    return {**config, "imports": [next(renamed) if _is_path(e) else e for e in entries]}


def check_paths(config: JSONDict, node_data: bool) -> None:
    """Refuse a relative path a SuperLink / SuperNode could not resolve (ConfigError saying what to give)."""
    for key, value in flatten(config).items():
        if key.rsplit(".", 1)[-1] not in PATH_KEYS or not isinstance(value, str) or not value:
            continue
        if node_data and key == "data.root":
            continue  # unused: each node reads its own data-root
        if not Path(value).expanduser().is_absolute():
            hint = "" if key != "data.root" else (", or let each SuperNode read its own site's data (node-data: "
                                                  "node config data-root, docs/deployment.md)")
            raise ConfigError(f"{key} = '{value}' is a relative path, which each SuperLink / SuperNode would resolve "
                              f"against its own working folder: give an absolute path (here: "
                              f"{Path(value).expanduser().resolve()}){hint}")


def app_run_config(app: Path) -> JSONDict:
    """The run config an App folder lists ([tool.flwr.app.config], flat dotted keys)."""
    try:
        project = tomli.loads((app / "pyproject.toml").read_text())
        nested = project["tool"]["flwr"]["app"]["config"]
    except (OSError, KeyError, tomli.TOMLDecodeError) as err:
        raise FedhetError(f"'{app}' is not a Flower App folder with [tool.flwr.app.config] ({err})") from None
    return flatten(nested)


def check_overrides(app: str | Path, overrides: list[str]) -> JSONDict:
    """The experiment config of `flwr run APP --run-config OVERRIDES`, checked as the SuperLink and the ServerApp
    will: a key the App does not list is a ConfigError naming the nearest valid key; a value fedhet refuses, the
    ServerApp's ConfigError."""
    from flwr.common.config import fuse_dicts, parse_config_args

    from fedhet.runtimes.flower.run_config import read_run_config

    listed = app_run_config(Path(app))
    given = parse_config_args(overrides)
    for key in given:
        if key not in listed:
            raise ConfigError(f"--run-config key '{key}' is not in the App's run config{nearest(key, list(listed))}; "
                              "Flower would refuse the run with '[code: 15] Invalid run configuration.'")
    config, _ = read_run_config(fuse_dicts(listed, given))
    return config


def summary_line(config: JSONDict) -> str:
    """The one line a valid run config gets from `fedhet flower check` and this module's `main`."""
    return f"ok: {config['method']} on {config['data']['dataset']}, {config['rounds']} rounds"


def main(argv: list[str] | None = None) -> int:
    """`python -m fedhet.runtimes.flower.app_checks APP --run-config "k=v ..."`: 0 and a line when the run config
    is valid, else 2 and the error."""
    parser = argparse.ArgumentParser(description="check `flwr run APP --run-config ...` before submitting it")
    parser.add_argument("app")
    parser.add_argument("--run-config", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        config = check_overrides(args.app, args.run_config)
    except FedhetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary_line(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
