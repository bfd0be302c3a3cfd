"""Reading YAML input (config files, overrides, reference tables) with one-line errors.

PyYAML's SafeLoader silently keeps the last of two equal keys; `UniqueKeyLoader` makes that an error naming the
key and both lines. `read_text` turns a file that is not UTF-8 or cannot be read into a ConfigError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fedhet.errors import ConfigError

JSONDict = dict[str, Any]  # Any: plain JSON/YAML data (configs, summary.json, metric rows)


class _DuplicateKey(yaml.YAMLError):
    """A mapping names `key` twice (on `line`, first on `first`)."""

    def __init__(self, key: Any, line: int, first: int) -> None:  # Any: a parsed YAML key
        super().__init__(f"key {key!r} on line {line} is already given on line {first}")
        self.key, self.line, self.first = key, line, first


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a key given twice in one mapping is an error (SafeLoader keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # Any: parsed YAML
        seen: dict[Any, int] = {}  # Any: parsed YAML keys
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` entries may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, line, seen[key])
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error in one line: 'line L, column C: problem'."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else str(problem)


def load_yaml(text: str, what: str, fix: str = "fix that line") -> Any:  # Any: parsed YAML
    """Parse YAML `text` with `UniqueKeyLoader`; `what` (e.g. "config file 'a.yaml'") names it in a ConfigError."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as err:
        lines = f" (line {err.first} and line {err.line})" if "\n" in text.strip() else ""
        raise ConfigError(f"{what}: key '{err.key}' is given twice{lines}; keep one of them") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} is not valid YAML ({_yaml_problem(err)}); {fix}") from err


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of `path` (a BOM is allowed), or a ConfigError naming the file, the problem and the fix."""
    if path.is_dir():
        raise ConfigError(f"{what} '{path}' is a folder; give the path of a YAML file")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} '{path}' is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset "
                          f"{err.start}); save it with UTF-8 encoding") from err
    except OSError as err:
        raise ConfigError(f"cannot read {what} '{path}': {err.strerror}; check the path and its permissions") from err
