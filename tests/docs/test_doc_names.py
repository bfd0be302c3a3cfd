"""No page names what is gone (issue 39 item 5): README.md and docs/*.md (not docs/results/, whose archived pages
quote the commands of their day) may name
- a test file `tests/.../test_x.py`, or a test `tests/...py::test_y` / `test_y`: it exists (a def in tests/);
- a module or object `fedhet.a.b` / a path `src/fedhet/a/b.py`: it imports / exists (an object of a module that
  needs a fedhet extra this environment lacks is not checked);
- a command `fedhet a b`: `a b` are subcommands of fedhet's parser, as far as the words are subcommand names.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_blocks import ROOT, pages  # noqa: E402

TEST_PATH = re.compile(r"\btests/[\w/.-]+\.py(?:::(\w+))?")
TEST_NAME = re.compile(r"`(test_\w+)`")
DOTTED = re.compile(r"(?<![\w./-])fedhet(?:\.[A-Za-z_]\w*)+")
SRC_PATH = re.compile(r"\bsrc/fedhet(?:/[\w.-]+)*")
COMMAND = re.compile(r"`fedhet ([a-z][\w-]*(?: [a-z][\w-]*)*)")
EXTRAS = ("flwr", "ray", "timm", "transformers", "peft", "diffusers", "datasets", "tensorboard", "opacus")


@cache
def defined_tests() -> frozenset[str]:
    """Every `def test_...` under tests/, and every `test_...` word of the code (`data.test_fraction` is a key)."""
    tests = [re.findall(r"^\s*(?:async )?def (test_\w+)", p.read_text(), re.M) for p in (ROOT / "tests").rglob("*.py")]
    code = [re.findall(r"\btest_\w+", p.read_text()) for p in (ROOT / "src" / "fedhet").rglob("*.py")]
    return frozenset(name for names in [*tests, *code] for name in names)


def stale_tests(text: str) -> list[str]:
    problems = []
    for match in TEST_PATH.finditer(text):
        path = ROOT / match.group(0).split("::")[0]
        if not path.is_file():
            problems.append(f"{match.group(0)}: no such file")
        elif match.group(1) and not re.search(rf"def {match.group(1)}\b", path.read_text()):
            problems.append(f"{match.group(0)}: no such test in {path.name}")
    gone = sorted(set(TEST_NAME.findall(text)) - defined_tests())
    problems += [f"`{name}`: no such test under tests/" for name in gone]
    return problems


def dotted_problem(name: str) -> str | None:
    """None if `fedhet.a.b.c` is a module or an object of one; else why not."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
            obj: object = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name and err.name.split(".")[0] in EXTRAS:
                return None
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{module} has no {'.'.join(parts[cut:])}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def fedhet_problems(text: str) -> list[str]:
    problems = []
    for name in sorted(set(DOTTED.findall(text))):
        why = dotted_problem(name.rstrip("."))
        if why:
            problems.append(f"{name}: {why}")
    problems += [f"{path}: no such file or folder" for path in sorted(set(SRC_PATH.findall(text)))
                 if not (ROOT / path.rstrip(".")).exists()]
    return problems


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser | None]:
    """A parser's subcommands, or the choices of its first positional argument (`fedhet data list`), or {}."""
    positional = [a for a in parser._actions if not a.option_strings]
    if not positional or positional[0].choices is None:
        return {}
    if isinstance(positional[0], argparse._SubParsersAction):
        return dict(positional[0].choices)
    return dict.fromkeys(positional[0].choices)


def command_problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """`fedhet a b ...` in back-quotes: each word, while the parser has subcommands, is one of them."""
    problems = []
    for words in sorted(set(COMMAND.findall(text))):
        current, path = parser, ["fedhet"]
        for word in words.split():
            choices = _subcommands(current)
            if not choices:
                break
            if word not in choices:
                problems.append(f"`{' '.join([*path, word])}`: {' '.join(path)} has no command {word!r} "
                                f"(it has {sorted(choices)})")
                break
            if choices[word] is None:
                break
            current, path = choices[word], [*path, word]  # type: ignore[assignment]
    return problems


def _parser() -> argparse.ArgumentParser:
    from fedhet.cli_parser import build_parser

    return build_parser()


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_the_page_names_only_what_exists(page: Path) -> None:
    text = page.read_text()
    problems = stale_tests(text) + fedhet_problems(text) + command_problems(text, _parser())
    assert not problems, f"{page.relative_to(ROOT)} names what does not exist:\n" + "\n".join(problems)


def test_the_checks_catch_stale_names() -> None:
    """Each check fails on a name that is gone (and passes on one that exists)."""
    assert stale_tests("`tests/docs/test_doc_names.py::test_the_checks_catch_stale_names`, `test_fraction`, "
                       "`test_no_such_thing`") == ["`test_no_such_thing`: no such test under tests/"]
    assert stale_tests("tests/docs/no_such.py and tests/docs/test_doc_names.py::test_gone") == \
        ["tests/docs/no_such.py: no such file", "tests/docs/test_doc_names.py::test_gone: no such test in "
         "test_doc_names.py"]
    assert fedhet_problems("fedhet.errors.ConfigError, fedhet.algorithms.registry., src/fedhet/cli.py") == []
    assert fedhet_problems("`fedhet.errors.NoSuchError` in src/fedhet/no_such.py") == \
        ["fedhet.errors.NoSuchError: fedhet.errors has no NoSuchError", "src/fedhet/no_such.py: no such file or folder"]
    assert dotted_problem("fedhet.no_such_module") == "fedhet has no no_such_module"
    parser = _parser()
    assert command_problems("`fedhet run CONFIG`, `fedhet data list`, `fedhet flower simulate CONFIG`", parser) == []
    assert len(command_problems("`fedhet runn CONFIG` and `fedhet data lists`", parser)) == 2
