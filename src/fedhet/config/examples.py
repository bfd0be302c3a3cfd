"""The example configs shipped inside the package (`fedhet/configs/`, the repository's `configs/` folder), so that
`pip install fedhet` users can run `fedhet run quickstart` or `fedhet run configs/quickstart.yaml` anywhere.

`find_config(path)` is the one place a config path is resolved: a path that exists is used as given; one that does
not (and is relative) is looked up among the examples (`quickstart`, `quickstart.yaml`, `configs/quickstart.yaml`,
`cpu/digits.yaml`), and the copy used is logged. `fedhet configs [--copy DIR]` (fedhet.launch.configs_cli) lists
or copies them out.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from fedhet.errors import ConfigError

log = logging.getLogger(__name__)

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "configs"  # in the repository a link to configs/


def list_examples() -> list[str]:
    """The shipped example configs, as paths relative to the examples folder ('quickstart.yaml', 'cpu/...')."""
    if not EXAMPLES_DIR.is_dir():
        return []
    return sorted(p.relative_to(EXAMPLES_DIR).as_posix() for p in EXAMPLES_DIR.rglob("*.yaml"))


def example_path(name: str | Path) -> Path | None:
    """The shipped example `name` names, or None: 'quickstart', 'quickstart.yaml' and 'configs/quickstart.yaml'
    all name `<examples>/quickstart.yaml`."""
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts:
        return None
    if parts[0] == "configs" and len(parts) > 1:
        parts = parts[1:]
    rel = Path(*parts)
    candidate = EXAMPLES_DIR / (rel if rel.suffix in (".yaml", ".yml") else rel.with_name(rel.name + ".yaml"))
    return candidate if candidate.is_file() else None


def find_config(path: str | Path) -> Path:
    """`path` if it exists, else the shipped example it names (logged), else `path` (the loader reports it)."""
    given = Path(path)
    if given.exists():
        return given
    example = example_path(given)
    if example is None:
        return given
    log.warning("config '%s' is not in %s; using the example shipped with fedhet: %s (copy it out with "
                "`fedhet configs --copy DIR`)", path, Path.cwd(), example)
    return example


def copy_examples(dest: str | Path) -> list[Path]:
    """Copy every shipped example to `dest` (keeping sub-folders); a file already there is an error, not replaced."""
    dest = Path(dest)
    names = list_examples()
    clashes = [n for n in names if (dest / n).exists()]
    if clashes:
        raise ConfigError(f"'{dest}' already holds {len(clashes)} of the example configs (e.g. {dest / clashes[0]}); "
                          "choose an empty or new folder")
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"'{dest}' is a file; give a folder to copy the example configs into")
    written = []
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        written.append(Path(shutil.copy2(EXAMPLES_DIR / name, dest / name)))
    return written
