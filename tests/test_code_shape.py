"""The code stays easy to live in: no file over 300 lines, no function over 60, no class over 15 methods."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fedhet"
MAX_FILE, MAX_FUNCTION, MAX_METHODS = 300, 60, 15


def shapes() -> tuple[list[str], list[str], list[str]]:
    files, functions, classes = [], [], []
    for path in sorted(SRC.rglob("*.py")):
        text, rel = path.read_text(), path.relative_to(SRC)
        if len(text.splitlines()) > MAX_FILE:
            files.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION:
                    functions.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
            if isinstance(node, ast.ClassDef):
                methods = [b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > MAX_METHODS:
                    classes.append(f"{rel}:{node.lineno} {node.name}: {len(methods)} methods")
    return files, functions, classes


def test_files_functions_and_classes_stay_small() -> None:
    files, functions, classes = shapes()
    assert not files, f"files over {MAX_FILE} lines: {files}"
    assert not functions, f"functions over {MAX_FUNCTION} lines: {functions}"
    assert not classes, f"classes over {MAX_METHODS} methods: {classes}"
