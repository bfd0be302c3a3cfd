"""docs/config.md lists every config key with its default and meaning, exactly as src/fedhet/config.py has them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedhet import config as C
from fedhet.config_doc import SECTIONS, default_of, render, render_value, rows

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"
REGENERATE = "regenerate it: python -m fedhet.config_doc --write docs/config.md"


def all_keys() -> dict[str, str]:
    """Every dotted config key of the dataclasses -> its default rendered as on the page."""
    out = {}
    for cls, prefix in [(C.ExperimentConfig, ""), *((cls, f"{name}.") for name, cls in SECTIONS)]:
        for f in dataclasses.fields(cls):
            default = default_of(f)
            if not dataclasses.is_dataclass(default):
                out[f"{prefix}{f.name}"] = render_value(default)
    return out


def test_every_key_and_default_is_on_the_page() -> None:
    page = PAGE.read_text()
    for key, default in all_keys().items():
        assert f"| `{key}` | `{default}` |" in page, f"docs/config.md lacks `{key}` with default `{default}`; " \
                                                     f"{REGENERATE}"


def test_every_key_has_a_meaning() -> None:
    for cls, prefix in [(C.ExperimentConfig, ""), *((cls, f"{name}.") for name, cls in SECTIONS)]:
        for key, _, meaning in rows(cls, prefix):
            assert meaning.strip(), f"config key {key} has no meaning for docs/config.md: add an inline comment " \
                                    "to its field in src/fedhet/config.py (or an entry in fedhet.config_doc.MEANINGS)"


def test_page_is_what_the_code_renders() -> None:
    page, want = PAGE.read_text().splitlines(), render().splitlines()
    diff = next((i for i, (a, b) in enumerate(zip(page, want, strict=False)) if a != b), min(len(page), len(want)))
    assert page == want, f"docs/config.md differs from the code at line {diff + 1}: " \
                         f"{page[diff] if diff < len(page) else '(end)'!r} vs " \
                         f"{want[diff] if diff < len(want) else '(end)'!r}; {REGENERATE}"



def test_every_section_is_on_the_page() -> None:
    sections = {f.name for f in dataclasses.fields(C.ExperimentConfig) if dataclasses.is_dataclass(default_of(f))}
    assert sections == {name for name, _ in SECTIONS}, "a config section is missing from fedhet.config_doc.SECTIONS"
