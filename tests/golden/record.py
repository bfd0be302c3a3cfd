"""Record the golden runs into tests/golden/golden.json (atomically). Only when a change of numbers is intended.

    python tests/golden/record.py                      # every case
    python tests/golden/record.py --only fedprox ditto # re-record these cases, keep the others
    python tests/golden/record.py --out /tmp/g2.json   # record elsewhere (e.g. to check determinism)
    python tests/golden/record.py --float64            # the float64 tier (golden_f64.py) into golden_f64.json

Run with one free core or more; the Flower cases start Ray with 2 CPUs. `--only` refuses to mix recordings of
two machines (see docs/golden.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, so that `golden.*` imports as in pytest

from golden import golden_f64  # noqa: E402
from golden.golden_cases import BASE, CASES, CASES_BY_NAME, GoldenCase  # noqa: E402
from golden.golden_runs import machine, run_case  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden.json"
GOLDEN_F64 = GOLDEN.with_name("golden_f64.json")
FORMAT = 1


def source() -> dict[str, str]:
    """Where the recorded fedhet came from: its package path and the git commit of that tree."""
    import fedhet

    path = Path(fedhet.__file__).resolve().parent
    git = ["git", "-C", str(path)]
    try:
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True,
                               check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"package": str(path), "commit": "unknown"}
    root = Path(__file__).resolve().parents[2]  # the checkout: the path is kept relative to it
    package = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    return {"package": package, "commit": commit.strip() + (" (modified)" if dirty.strip() else "")}


def case_entry(case: GoldenCase, result: dict[str, Any]) -> dict[str, Any]:
    """One case in golden.json: its definition (to detect a stale recording) and its fingerprint."""
    return {"method": case.method, "runtime": case.runtime, "overrides": list(case.overrides), **result}


def dumps(data: dict[str, Any]) -> str:
    """golden.json's text: one line per metric row and per tensor, so that a re-recording diffs readably."""
    def block(items: list[str], indent: str) -> str:
        if not items:
            return ""
        return "\n" + ",\n".join(indent + item for item in items) + "\n" + indent[:-1]

    cases = []
    for name, case in data["cases"].items():
        rows = block([json.dumps(r) for r in case["metrics"]], "    ")
        glob = "null" if case["global"] is None else "{" + block(
            [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in case["global"].items()], "    ") + "}"
        head = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in case.items() if k not in ("metrics", "global"))
        cases.append(f'{json.dumps(name)}: {{{head},\n   "metrics": [{rows}],\n   "global": {glob}}}')
    top = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k != "cases"]
    return "{" + block([*top, '"cases": {' + block(cases, "  ") + "}"], " ") + "}\n"


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write golden.json to a temporary file next to `path`, fsync, then rename over it."""
    text = dumps(data)
    if json.loads(text) != data:
        raise AssertionError("golden.json's text does not read back as the recorded data")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record(cases: list[GoldenCase], out: Path, every: tuple[GoldenCase, ...] = CASES) -> None:
    """Run `cases` (of `every`, the file's whole set) and write them into `out`, keeping the other cases already
    recorded there."""
    here = machine()
    data: dict[str, Any] = {"format": FORMAT, "machine": here, "source": source(), "base": list(BASE), "cases": {}}
    if len(cases) < len(every) and out.exists():
        old = json.loads(out.read_text())
        if old.get("machine") != here:
            sys.exit(f"record.py: {out} was recorded on {old.get('machine')}, this machine is {here}: "
                     "re-record every case (no --only), so that one file holds one machine's numbers")
        data["cases"] = {k: v for k, v in old["cases"].items() if k in {c.name for c in every}}
    for case in cases:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"golden-{case.name}-") as tmp:
            data["cases"][case.name] = case_entry(case, run_case(case, Path(tmp) / "run"))
        print(f"{case.name:36s} {time.perf_counter() - start:6.1f} s", flush=True)
    data["cases"] = {c.name: data["cases"][c.name] for c in every if c.name in data["cases"]}
    write_atomic(out, data)
    print(f"wrote {len(data['cases'])} cases to {out} ({here})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(CASES_BY_NAME),
                        help="re-record only these cases")
    parser.add_argument("--out", type=Path, help=f"output file (default {GOLDEN}, with --float64 {GOLDEN_F64})")
    parser.add_argument("--float64", action="store_true", help="record the float64 tier (golden_f64.py)")
    args = parser.parse_args(argv)
    every = golden_f64.CASES if args.float64 else CASES
    by_name = {c.name: c for c in every}
    unknown = sorted(set(args.only or ()) - set(by_name))
    if unknown:
        parser.error(f"not cases of this tier: {unknown}")
    cases = [by_name[n] for n in args.only] if args.only else list(every)
    with golden_f64.float64_mode() if args.float64 else contextlib.nullcontext():
        record(cases, args.out or (GOLDEN_F64 if args.float64 else GOLDEN), every)


if __name__ == "__main__":
    main()
