"""Mutation pass over the loss and update functions of the owned methods and their tuners (a benchmark, not a CI
gate): how many plausible broken variants does each method's test set catch?

Each mutant changes one spot of one target function (the operators below: a flipped sign or operator, a dropped
term, swapped call arguments, a flipped comparison, min/max or argmin/argmax swapped, a removed `.detach()`, a
constant moved). It is written into a copy of src/ (PYTHONPATH puts the copy first; the working tree is never
touched), and the method's test files run against it: "killed" when a test fails, "survived" when all pass,
"timeout" when they take 4x the unmutated time (counted as killed, as mutmut does). Results go to a JSON file,
one mutant per line, so a stopped pass resumes where it stopped; `--report` writes the Markdown summary.

    python benchmarks/mutation_pass.py --methods ditto_mmd --out docs/results/mutation/mutants.jsonl
    python benchmarks/mutation_pass.py --report docs/results/mutation/mutants.jsonl > docs/results/mutation.md
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"__init__", "__post_init__", "validate", "__repr__", "state", "to_cpu", "check_saved"}


@dataclass(frozen=True)
class Target:
    """A method's mutated functions (per file; "*" = every function but SKIP) and the tests that guard them."""

    files: dict[str, tuple[str, ...]]
    tests: tuple[str, ...]


ALL = ("*",)
TARGETS: dict[str, Target] = {
    "fraug": Target({"src/fedhet/algorithms/fraug_losses.py": ALL, "src/fedhet/algorithms/fraug.py": ALL},
                    ("tests/algorithms/test_fraug.py", "tests/algorithms/test_fraug_losses.py",
                     "tests/algorithms/test_fraug_official.py")),
    "ditto_mmd": Target({"src/fedhet/algorithms/ditto_mmd.py": ("personal_loss", "accumulate", "finish"),
                         "src/fedhet/algorithms/ditto_mmd_penalty.py": ("penalty", "fit", "learns"),
                         "src/fedhet/losses/mk_mmd.py": ALL},
                        ("tests/algorithms/test_ditto_mmd.py", "tests/losses/test_mk_mmd.py")),
    "feddat": Target({"src/fedhet/algorithms/feddat.py": ALL, "src/fedhet/losses/distillation.py": ALL},
                     ("tests/algorithms/test_feddat.py", "tests/algorithms/test_feddat_official.py",
                      "tests/losses/test_distillation.py")),
    "adaptfed": Target({"src/fedhet/algorithms/adaptfed.py": ALL, "src/fedhet/models/hypernet_update.py": ALL},
                       ("tests/algorithms/test_adaptfed.py", "tests/algorithms/test_adaptfed_routing.py")),
    "fedpop": Target({"src/fedhet/tune/fedpop.py": ALL, "src/fedhet/tune/evo.py": ALL,
                      "src/fedhet/tune/fedex.py": ALL},
                     ("tests/tune/test_fedpop_rules.py", "tests/tune/test_tune_evo.py", "tests/tune/test_fedex.py")),
    "fedbip": Target({"src/fedhet/algorithms/fedbip.py": ALL, "src/fedhet/algorithms/fedbip_parts.py": ALL},
                     ("tests/ldm/test_fedbip_computes.py", "tests/ldm/test_fedbip_method.py",
                      "tests/ldm/test_fedbip_start.py")),
}
SWAP_OPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                              ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE,
                              ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.And: ast.Or, ast.Or: ast.And}
SWAP_NAMES = {"min": "max", "max": "min", "argmin": "argmax", "argmax": "argmin", "amin": "amax", "amax": "amin"}


def _is_doc_or_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _edits(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(description, replacement node) for every mutation of `node` itself."""
    if isinstance(node, ast.BinOp) and type(node.op) in SWAP_OPS:
        yield f"{type(node.op).__name__} -> {SWAP_OPS[type(node.op)].__name__}", ast.BinOp(
            node.left, SWAP_OPS[type(node.op)](), node.right)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            yield "drop right term", node.left
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        yield f"drop {type(node.op).__name__}", node.operand
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAP_OPS:
        yield f"{type(node.ops[0]).__name__} -> {SWAP_OPS[type(node.ops[0])].__name__}", ast.Compare(
            node.left, [SWAP_OPS[type(node.ops[0])]()], node.comparators)
    if isinstance(node, ast.BoolOp) and type(node.op) in SWAP_OPS:
        yield f"{type(node.op).__name__} -> {SWAP_OPS[type(node.op)].__name__}", ast.BoolOp(
            SWAP_OPS[type(node.op)](), node.values)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in SWAP_NAMES:
            new_func: ast.expr = (ast.Attribute(func.value, SWAP_NAMES[name], func.ctx)
                                  if isinstance(func, ast.Attribute) else ast.Name(SWAP_NAMES[name], ast.Load()))
            yield f"{name} -> {SWAP_NAMES[name]}", ast.Call(new_func, node.args, node.keywords)
        if name == "detach" and isinstance(func, ast.Attribute) and not node.args:
            yield "drop .detach()", func.value
        if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]) \
                and not any(_is_doc_or_text(a) for a in node.args[:2]):
            yield f"swap args of {name or 'call'}", ast.Call(func, [node.args[1], node.args[0], *node.args[2:]],
                                                             node.keywords)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
        yield f"constant {node.value!r} -> {node.value + 1!r}", ast.Constant(node.value + 1)


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, replacement: ast.AST) -> None:
        self.target, self.replacement = target, replacement

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            return self.replacement
        return super().generic_visit(node)


def _functions(tree: ast.Module, names: tuple[str, ...]) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name not in SKIP and (names == ALL or node.name in names):
            yield node


def mutants(path: Path, names: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """(description, mutated source) for every mutation point of the named functions of one file."""
    source = path.read_text()
    points = []
    for fn in _functions(ast.parse(source), names):
        for node in ast.walk(fn):
            if node is fn or isinstance(node, (ast.JoinedStr, ast.Raise)) or _is_doc_or_text(node):
                continue
            for i, (what, _) in enumerate(_edits(node)):
                points.append((fn.name, getattr(node, "lineno", fn.lineno), what, i, type(node).__name__,
                               ast.dump(node)))
    for fn_name, line, what, index, _, dump in points:
        tree = ast.parse(source)  # fresh tree: find the same node again by position and shape
        node = next(n for f in _functions(tree, (fn_name,)) for n in ast.walk(f)
                    if getattr(n, "lineno", None) == line and ast.dump(n) == dump)
        replacement = [r for _, r in _edits(node)][index]
        mutated = ast.unparse(ast.fix_missing_locations(_Replace(node, replacement).visit(tree)))
        yield f"{fn_name}:{line}: {what}", mutated


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=ROOT, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - start
    return ("survived" if done.returncode == 0 else "killed"), time.perf_counter() - start


def run(methods: list[str], out: Path, limit: int | None, seed: int) -> None:
    done = {(r["method"], r["file"], r["mutant"]) for r in _read(out)}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        shutil.copytree(ROOT / "src", copy / "src")
        for method in methods:
            target = TARGETS[method]
            status, base = run_tests(copy, target.tests, timeout=1800)
            if status != "survived":
                sys.exit(f"{method}: the tests fail without a mutant ({status}); fix them first")
            todo = [(f, what, text) for f, names in target.files.items() for what, text in mutants(ROOT / f, names)]
            random.Random(seed).shuffle(todo)
            for file, what, text in todo[:limit]:
                if (method, file, what) in done:
                    continue
                original = (copy / file).read_text()
                (copy / file).write_text(text)
                try:
                    status, seconds = run_tests(copy, target.tests, timeout=4 * base + 10)
                finally:
                    (copy / file).write_text(original)
                row = {"method": method, "file": file, "mutant": what, "status": status, "seconds": round(seconds, 1),
                       "of": len(todo)}
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{method:<10} {status:<8} {file}:{what}", flush=True)


def _read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def report(path: Path) -> str:
    """Markdown: the score per method and every surviving mutant."""
    rows = _read(path)
    lines = ["| method | mutation points | run | killed (timeouts) | survived | score |", "|---|---|---|---|---|---|"]
    for method in sorted({str(r["method"]) for r in rows}):
        mine = [r for r in rows if r["method"] == method]
        killed = sum(r["status"] != "survived" for r in mine)
        timeouts = sum(r["status"] == "timeout" for r in mine)
        points = max(int(str(r["of"])) for r in mine)
        lines.append(f"| {method} | {points} | {len(mine)} | {killed} ({timeouts}) | {len(mine) - killed} | "
                     f"{100 * killed / len(mine):.0f} % |")
    lines += ["", "Surviving mutants:", ""]
    lines += [f"- {r['method']}: `{r['file']}` {r['mutant']}" for r in rows if r["status"] == "survived"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(TARGETS))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "mutation" / "mutants.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="at most this many mutants per method (a sample)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's order")
    parser.add_argument("--report", type=Path, default=None, help="print the summary of this results file")
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run([m.strip() for m in args.methods.split(",") if m.strip()], args.out, args.limit, args.seed)


if __name__ == "__main__":
    main()
