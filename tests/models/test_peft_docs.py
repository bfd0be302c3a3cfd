"""The example in docs/models/peft.md runs and prints the A_s count it claims."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "models" / "peft.md"


def test_docs_example_runs() -> None:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), str(DOC), "exec"), {})
    assert out.getvalue().split() == ["1160"]
