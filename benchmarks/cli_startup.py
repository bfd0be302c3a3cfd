"""CPU seconds (user + sys, so a busy machine does not inflate them) of the commands a user types first, and the
wall time until `fedhet run` prints its first line. Writes docs/results/cli_startup.json.

    python benchmarks/cli_startup.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pty
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"--help": ["--help"], "methods": ["methods"], "data list": ["data", "list"], "--version": ["--version"]}


def cpu_seconds(argv: list[str]) -> float:
    """user + sys CPU of one `fedhet ARGV` child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "fedhet.cli", *argv], cwd=ROOT, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def first_line_seconds() -> float:
    """Wall seconds until `fedhet run configs/quickstart.yaml` writes its first byte to a terminal (a pty, as a
    user sees it; then it is stopped)."""
    leader, follower = pty.openpty()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, subprocess.Popen(
            [sys.executable, "-m", "fedhet.cli", "run", "configs/quickstart.yaml", "rounds=1", "--run-dir", tmp],
            cwd=ROOT, stdout=follower, stderr=follower) as proc:
        os.read(leader, 1)
        seconds = time.perf_counter() - start
        proc.kill()
    os.close(leader)
    os.close(follower)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "cli_startup.json")
    args = parser.parse_args()
    result = {name: min(cpu_seconds(argv) for _ in range(args.repeat)) for name, argv in COMMANDS.items()}
    result = {k: round(v, 3) for k, v in result.items()}
    result["run: first line (wall s)"] = round(min(first_line_seconds() for _ in range(args.repeat)), 2)
    payload = {"cpu_seconds_min_of_repeats": result, "machine": platform.processor() or platform.machine(),
               "cores": os.cpu_count(), "load_average": os.getloadavg()}
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    print(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
