#!/usr/bin/env bash
# FRAug reproduction on the CPU (docs/results/fraug.md): Table 2 on Office-Caltech10 SURF, Real Digits and PACS
# (10 methods x 3 seeds), Tables 5/6/7/10 on Digits and PACS (1 seed), the MMD-bandwidth probe, the cost
# measurement, and the reports.
#   FEDHET_DATA=/path/to/shared/data bash benchmarks/fraug_tables.sh            # everything (many hours on 2 cores)
#   FEDHET_DATA=... bash benchmarks/fraug_tables.sh table2-digits   # Table 2 core rows: single, fedavg, fedbn, fraug
#   FEDHET_DATA=... bash benchmarks/fraug_tables.sh table5-rt-pacs  # Table 5 rows 1-2 (no generator), seed 0
#   FEDHET_DATA=... bash benchmarks/fraug_tables.sh reports         # only rebuild docs/results/fraug/ from runs/
#   REPORTS="pacs surf" bash benchmarks/fraug_tables.sh reports      # only those datasets' reports
# Modes: all, surf, digits, pacs (every sweep of that dataset), table2-{surf,digits,pacs}, table5-rt-{digits,pacs},
# bandwidth-{surf,digits,pacs}, cost, reports. Sweeps skip finished runs and resume interrupted ones, so the script can
# be stopped and restarted. THREADS (default 1) is run.num_threads of every run.
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-1}
OUT=docs/results/fraug
what=${1:-all}
REPORTS=${REPORTS:-surf digits pacs}  # datasets whose reports `reports` rebuilds
CORE=single,fedavg,fedbn,fraug  # Table 2 rows that FRAug's defaults affect (fraug) and its references

sweep() { local cfg=$1; shift; $FEDHET sweep "$cfg" "run.num_threads=$THREADS" --quiet "$@"; }
cfg_of() { case $1 in surf) echo configs/office_caltech10_surf.yaml ;; *) echo "configs/cpu/$1.yaml" ;; esac; }

case $what in
  table2-*) sweep "$(cfg_of "${what#table2-}")" --methods $CORE ;;
  table5-rt-*) sweep "configs/cpu/${what#table5-rt-}_fraug_tables.yaml" --methods fraug_rt,fraug_rt_ema,fraug_rt_ema_proto ;;
  bandwidth-*) ds=${what#bandwidth-}
    cfg=configs/cpu/${ds}_fraug_bandwidth.yaml; [[ $ds == surf ]] && cfg=configs/fraug_surf_bandwidth.yaml
    $PY benchmarks/fraug_bandwidth.py "$cfg" "run.num_threads=$THREADS" --out "$OUT/bandwidth_$ds.json" ;;
esac
if [[ $what == all || $what == surf ]]; then sweep configs/office_caltech10_surf.yaml; fi
for ds in digits pacs; do
  [[ $what == all || $what == "$ds" ]] || continue
  sweep "configs/cpu/$ds.yaml"
  sweep "configs/cpu/${ds}_fraug_investigate.yaml"
  if [[ $ds == digits ]]; then sweep configs/cpu/digits_r50.yaml; fi
  sweep "configs/cpu/${ds}_fraug_tables.yaml"
done
if [[ $what == all || $what == cost ]]; then
  $PY benchmarks/fraug_cost.py --config configs/cpu/digits.yaml --out $OUT/cost_digits.json
  $PY benchmarks/fraug_cost.py --config configs/cpu/pacs.yaml --out $OUT/cost_pacs.json
fi
[[ $what == all || $what == reports ]] || exit 0

# Reports: one folder per table and dataset, written only when every run the table needs is in runs/ (a partial
# table never overwrites a complete one); Tables 5/6/7/10 ran seed 0, so their reference rows are seed 0 too.
report() {
  local out=$1 ref=$2; shift 2
  for run in "$@"; do  # a seed directory, or a method directory with at least one finished seed
    if ! compgen -G "$run/summary.json" >/dev/null && ! compgen -G "$run/seed*/summary.json" >/dev/null; then
      echo "skip $out: $run missing"; return
    fi
  done
  $FEDHET report "$@" --out "$OUT/$out" ${ref:+--reference "$ref"}
}
seed0() { local root=$1; shift; for v in "$@"; do echo "$root/$v/seed0"; done; }
all() { local root=$1; shift; for v in "$@"; do echo "$root/$v"; done; }
surf=runs/office_caltech10_surf/office_caltech10_surf
if [[ " $REPORTS " == *" surf "* ]]; then
  report table2_surf "" $(all $surf single all fedavg fedprox fedproto fedbabu pfedavg partialfed fedbn fraug)
  report table2_surf_core "" $(all $surf single fedavg fedbn fraug fraug_csum)
  report bandwidth_surf "" $(all $surf fedbn fraug fraug_bw_real fraug_csum fraug_csum_bw_real)
fi
if [[ " $REPORTS " == *" digits "* ]]; then
  report digits_r50 "" runs/cpu_digits_r50/digits/fraug runs/cpu_digits_r50/digits/fedbn runs/cpu_digits_r50/digits/fedavg
fi
for ds in digits pacs; do
  [[ " $REPORTS " == *" $ds "* ]] || continue
  root=runs/cpu_$ds/$ds
  report table2_$ds configs/paper/fraug_table2_$ds.yaml \
    $(all $root single all fedavg fedprox fedproto fedbabu pfedavg partialfed fedbn fraug)
  report table2_${ds}_core configs/paper/fraug_table2_$ds.yaml $(all $root single fedavg fedbn fraug)
  rate=$([[ $ds == pacs ]] && echo fraug_rate0.2 || echo fraug_rate0.1)
  report investigate_$ds "" $(all $root fedavg fedbn fraug fraug_csum $rate)
  report table5_$ds configs/paper/fraug_table5_$ds.yaml \
    $(seed0 $root fedbn fraug_rt fraug_rt_ema fraug_g fraug_g_ema fraug_g_rt fraug)
  report table5_rt_$ds configs/paper/fraug_table5_$ds.yaml $(seed0 $root fedbn fraug_rt fraug_rt_ema fraug_rt_ema_proto \
    fraug)
  report table6_$ds "" $(seed0 $root fedavg fedbn fraug fedavg_sigma0.01 fedbn_sigma0.01 fraug_sigma0.01 \
    fedavg_sigma0.1 fedbn_sigma0.1 fraug_sigma0.1 fedavg_sigma1 fedbn_sigma1 fraug_sigma1)
  report table7_$ds "" $(seed0 $root fedavg fedbn uniform_0.1 laplace_0.1 gaussian_0.1 uniform_1 laplace_1 \
    gaussian_1 fraug)
  report table10_$ds "" $(seed0 $root single fedavg fedbn fraug single_frac0.5 fedavg_frac0.5 fedbn_frac0.5 \
    fraug_frac0.5 single_frac0.2 fedavg_frac0.2 fedbn_frac0.2 fraug_frac0.2 single_frac0.1 fedavg_frac0.1 \
    fedbn_frac0.1 fraug_frac0.1)
  report bandwidth_$ds "" $(all $root fedbn fraug fraug_bw_real)
done
