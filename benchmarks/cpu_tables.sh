#!/usr/bin/env bash
# The CPU reproduction of the foundation issue's tables (docs/results/digits_pacs.md):
# memory-flatness check, then Real Digits and PACS sweeps (Single, All, FedAvg, FedProx, FedBN x 3 seeds).
#   FEDHET_DATA=/path/to/shared/data bash benchmarks/cpu_tables.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
FEDHET=${FEDHET:-.venv/bin/fedhet}
$PY benchmarks/memory_flat.py --rounds 50 --method fedbn --out docs/results/memory_fedbn.json
$FEDHET sweep configs/cpu/digits.yaml --quiet --report-dir docs/results/cpu_digits
$FEDHET sweep configs/cpu/pacs.yaml --quiet --report-dir docs/results/cpu_pacs
