#!/usr/bin/env bash
# FRAug reproduction on the CPU (docs/results/fraug.md): Table 2 on Office-Caltech10 SURF, Real Digits and PACS
# (10 methods x 3 seeds), Tables 5/6/7/10 on Digits and PACS (1 seed), the cost measurement, and the reports.
#   FEDHET_DATA=/path/to/shared/data bash benchmarks/fraug_tables.sh            # everything (hours on 2 cores)
#   FEDHET_DATA=... bash benchmarks/fraug_tables.sh reports                      # only rebuild the reports
# Sweeps skip finished runs and resume interrupted ones, so the script can be stopped and restarted.
# On 2 cores, two sweeps side by side with one torch thread each are ~20% faster than one with two threads:
#   THREADS=1 bash benchmarks/fraug_tables.sh digits & THREADS=1 bash benchmarks/fraug_tables.sh pacs
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-2}
OUT=docs/results/fraug
what=${1:-all}

sweep() { $FEDHET sweep "$1" "run.num_threads=$THREADS" --quiet; }

if [[ $what == all || $what == surf ]]; then sweep configs/office_caltech10_surf.yaml; fi
if [[ $what == all || $what == digits ]]; then
  sweep configs/cpu/digits.yaml
  sweep configs/cpu/digits_fraug_investigate.yaml
  sweep configs/cpu/digits_r50.yaml
  sweep configs/cpu/digits_fraug_tables.yaml
fi
if [[ $what == all || $what == pacs ]]; then
  sweep configs/cpu/pacs.yaml
  sweep configs/cpu/pacs_fraug_investigate.yaml
  sweep configs/cpu/pacs_fraug_tables.yaml
fi
if [[ $what == all || $what == cost ]]; then
  $PY benchmarks/fraug_cost.py --config configs/cpu/digits.yaml --out $OUT/cost_digits.json
  $PY benchmarks/fraug_cost.py --config configs/cpu/pacs.yaml --out $OUT/cost_pacs.json
fi

# Reports: one folder per table and dataset. Tables 5/6/7/10 ran one seed with class_reduction mean for every
# FRAug row, so their reference rows are the Table 2 runs of fedbn / fedavg / single and the investigation's
# fraug_cmean, at seed 0 only. Missing runs are left out of a table (|| true: a table may still be partial).
report() { local out=$1 ref=$2; shift 2; $FEDHET report "$@" --out "$OUT/$out" ${ref:+--reference "$ref"}; }
seed0() { local root=$1; shift; for v in "$@"; do [[ -d $root/$v/seed0 ]] && echo "$root/$v/seed0"; done; }
report table2_surf "" $(for m in single all fedavg fedprox fedproto fedbabu pfedavg partialfed fedbn fraug \
  fraug_cmean; do echo runs/office_caltech10_surf/office_caltech10_surf/$m; done) || true
report digits_r50 "" runs/cpu_digits_r50 || true
for ds in digits pacs; do
  root=runs/cpu_$ds/$ds
  [[ -d $root/fraug ]] || continue
  report table2_$ds configs/paper/fraug_table2_$ds.yaml \
    $(for m in single all fedavg fedprox fedproto fedbabu pfedavg partialfed fedbn fraug; do echo $root/$m; done)
  report investigate_$ds "" $root/fedavg $root/fedbn $root/fraug $root/fraug_cmean || true
  report table5_$ds configs/paper/fraug_table5_$ds.yaml \
    $(seed0 $root fedbn fraug_rt fraug_rt_ema fraug_g fraug_g_ema fraug_g_rt fraug_cmean) || true
  report table6_$ds "" $(seed0 $root fedavg fedbn fraug_cmean fedavg_sigma0.01 fedbn_sigma0.01 fraug_sigma0.01 \
    fedavg_sigma0.1 fedbn_sigma0.1 fraug_sigma0.1 fedavg_sigma1 fedbn_sigma1 fraug_sigma1) || true
  report table7_$ds "" $(seed0 $root fedavg fedbn uniform_0.1 laplace_0.1 gaussian_0.1 uniform_1 laplace_1 \
    gaussian_1 fraug_cmean) || true
  report table10_$ds "" $(seed0 $root single fedavg fedbn fraug_cmean single_frac0.5 fedavg_frac0.5 fedbn_frac0.5 \
    fraug_frac0.5 single_frac0.2 fedavg_frac0.2 fedbn_frac0.2 fraug_frac0.2 single_frac0.1 fedavg_frac0.1 \
    fedbn_frac0.1 fraug_frac0.1) || true
done
# Table 5 of PACS with the literal sum over classes (the first, partial attempt, kept for the record)
report table5_pacs_literal configs/paper/fraug_table5_pacs.yaml \
  $(seed0 runs/cpu_pacs/pacs fedbn fraug) $(seed0 runs/cpu_pacs_literal/pacs fraug_rt fraug_rt_ema fraug_g \
  fraug_g_ema) || true
