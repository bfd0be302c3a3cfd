#!/usr/bin/env bash
# FedDAT (docs/results/feddat.md): the stand-in backbone, the structure of Tables 2-3 (FedDAT + 8 baselines x the
# four easy-VQA benchmarks x 3 seeds), the Table 4 ablation and the official code's switches (Domain and
# Function), the MiniLM-L6 run, then the
# report folders in docs/results/feddat/ and the paper-layout tables. Sweeps skip finished runs and resume
# interrupted ones (a finished run made with another config is an error), so the script can be stopped and
# restarted; stages run in this order unless one is named. SEEDS=1 runs seed 1 only (a quick look).
#   bash benchmarks/feddat_tables.sh [pretrain|tables|ablation|switches|official|minilm|reports]
# tables / ablation / switches were run (2026-11-24) with the paper's settings, the defaults before issue 37
# (commit 5ff1e6b); `official` re-runs with the official code's defaults (docs/feddat.md).
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
PY=${PY:-.venv/bin/python}
OUT=docs/results/feddat
what=${1:-all}
SEEDS=${SEEDS:-1,2,3}
BENCHMARKS="easy_vqa_domain easy_vqa_function easy_vqa_scene easy_vqa_task"

if [[ $what == all || $what == pretrain ]]; then
  $FEDHET pretrain configs/feddat/pretrain.yaml --out runs/feddat/backbone.pt --epochs 20
fi
if [[ $what == all || $what == tables ]]; then
  for b in $BENCHMARKS; do $FEDHET sweep configs/feddat/tables.yaml --datasets "$b" --seeds "$SEEDS" -q; done
fi
if [[ $what == all || $what == ablation ]]; then
  for b in easy_vqa_domain easy_vqa_function; do $FEDHET sweep configs/feddat/ablation.yaml --datasets "$b" --seeds "$SEEDS" -q; done
fi
if [[ $what == all || $what == switches ]]; then
  for b in easy_vqa_domain easy_vqa_function; do $FEDHET sweep configs/feddat/switches.yaml --datasets "$b" --seeds "$SEEDS" -q; done
fi
if [[ $what == all || $what == official ]]; then
  for b in easy_vqa_domain easy_vqa_function; do $FEDHET sweep configs/feddat/official.yaml --datasets "$b" --seeds "$SEEDS" -q; done
fi
if [[ $what == all || $what == minilm ]]; then
  $FEDHET sweep configs/feddat/minilm.yaml --seeds 1 -q
fi
if [[ $what == all || $what == reports ]]; then
  for b in $BENCHMARKS; do
    [[ -d runs/feddat_tables/$b ]] && $FEDHET report runs/feddat_tables/$b --out "$OUT/$b"
  done
  [[ -d runs/feddat_tables ]] && $PY benchmarks/feddat_tables.py runs/feddat_tables --out $OUT/tables.md
  [[ -d runs/feddat_ablation ]] && $PY benchmarks/feddat_tables.py runs/feddat_ablation runs/feddat_tables/easy_vqa_domain/feddat \
    runs/feddat_tables/easy_vqa_function/feddat --rows ablation --out $OUT/ablation.md
  [[ -d runs/feddat_switches ]] && $PY benchmarks/feddat_tables.py runs/feddat_switches runs/feddat_tables/easy_vqa_domain/feddat \
    runs/feddat_tables/easy_vqa_function/feddat --rows switches --out $OUT/switches.md
  [[ -d runs/feddat_official ]] && $PY benchmarks/feddat_tables.py runs/feddat_official --rows official --out $OUT/official.md
  # the cut re-run of docs/results/feddat.md (Domain, 10 rounds): rounds=10 eval.every=10 name=feddat_official_r10
  [[ -d runs/feddat_official_r10 ]] && $PY benchmarks/feddat_tables.py runs/feddat_official_r10 runs/feddat_paper_r10 \
    --rows official --out $OUT/official_r10.md
  [[ -d runs/feddat_minilm ]] && $PY benchmarks/feddat_tables.py runs/feddat_minilm --out $OUT/minilm.md
fi
