"""The code blocks of README.md and docs/*.md, and the `fedhet ...` command lines in their shell blocks.

A block may be marked by an HTML comment on the line(s) just above its fence (other comments, like
`<!-- example: strategy -->`, may stand between):

    <!-- doc-test: skip (why it cannot run here) -->     never run; listed with its reason
    <!-- doc-test: slow (why it takes long) -->          run only by `pytest -m slow`

A python block whose first line is `# name.py` is also written to `name.py` in the page's folder, where the
page's other blocks and command lines find it (e.g. `imports=[./my_models.py]`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELLS = ("bash", "sh", "console", "shell")
MARKER = re.compile(r"<!--\s*doc-test:\s*(\w+)\s*(?:\((.*)\))?\s*-->")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
RUN_CONFIG = re.compile(r"--run-config\s+('[^']*'|\"[^\"]*\")")
NODE_CONFIG = re.compile(r"--node-config\s+('[^']*'|\"[^\"]*\")")
SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None = None  # skip / slow
    reason: str = ""

    @property
    def name(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"

    @property
    def filename(self) -> str | None:
        first = self.code.splitlines()[0] if self.code.strip() else ""
        found = re.fullmatch(r"#\s*([\w.-]+\.py)\s*", first)
        return found.group(1) if found else None


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        marker, reason = _marker(text.splitlines()[: line - 1])
        found.append(Block(page, line, match.group(1).lower(), match.group(2), marker, reason))
    return found


def _marker(before: list[str]) -> tuple[str | None, str]:
    """The doc-test marker among the HTML comment lines right above a fence."""
    for raw in reversed(before):
        line = raw.strip()
        if not (line.startswith("<!--") and line.endswith("-->")):
            break
        found = MARKER.fullmatch(line)
        if found:
            return found.group(1), (found.group(2) or "").strip()
    return None, ""


def stray_markers(page: Path) -> list[str]:
    """doc-test comments that mark no block or are malformed (they would silently do nothing)."""
    text = page.read_text()
    used = {(b.line, b.marker) for b in blocks(page) if b.marker}
    problems = []
    for i, line in enumerate(text.splitlines(), 1):
        if "doc-test" not in line:
            continue
        found = MARKER.fullmatch(line.strip())
        if not found or found.group(1) not in ("skip", "slow") or not (found.group(2) or "").strip():
            problems.append(f"{page.name}:{i}: write <!-- doc-test: skip (reason) --> or slow (reason): {line!r}")
        elif not any(fence > i and marker == found.group(1) for fence, marker in used):
            problems.append(f"{page.name}:{i}: the marker is not right above a code block")
    return problems


def fedhet_commands(block: Block) -> list[list[str]]:
    """The argument lists of every `fedhet ...` invocation in a shell block (after `VAR=value` prefixes, `&&`,
    `|`, `&`; in a console block only the `$ ` lines); `[--flag value]` marks optional flags in the docs, checked
    as if given."""
    found = []
    for line in block.code.replace("\\\n", " ").splitlines():
        if block.lang == "console":  # a session: `$ command` lines, the rest is output
            if not line.startswith("$ "):
                continue
            line = line[2:]
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        segment: list[str] = []
        for token in [*lexer, ";"]:
            if token in SEPARATORS:
                found.extend(_fedhet_argv(segment))
                segment = []
            else:
                segment.append(token)
    return found


def _fedhet_argv(tokens: list[str]) -> list[list[str]]:
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        tokens = tokens[1:]  # FEDHET_DATA=/path fedhet ...
    if not tokens or Path(tokens[0]).name != "fedhet":
        return []
    argv, optional = [], False
    for token in tokens[1:]:
        if token.startswith("[-"):
            token, optional = token[1:], True
        if optional and token.endswith("]"):
            token, optional = token[:-1], False
        argv.append(token)
    return [argv]


def run_config_strings(page: Path) -> list[tuple[str, bool]]:
    """(value, shows an error) of every `--run-config "..."` on the page (shell blocks and inline code alike); an
    example of a refused run config shows the error (`error: ...`) on its line or the two after it."""
    text = page.read_text()
    found = []
    for m in RUN_CONFIG.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        after = "\n".join(text[start:].splitlines()[:3])
        found.append((shlex.split(m.group(1))[0], re.search(r"\berror:", after) is not None))
    return found


def node_config_strings(page: Path) -> list[str]:
    """The value of every `--node-config "..."` on the page."""
    return [shlex.split(m.group(1))[0] for m in NODE_CONFIG.finditer(page.read_text())]
