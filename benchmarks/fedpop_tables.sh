#!/usr/bin/env bash
# FedPop (Chen et al., AAAI 2025; spec fedpop.md; docs/results/fedpop.md): the structure of the paper's tables with
# `fedhet tune`, scaled down for a CPU. Stages, in this order unless one is named:
#   table2       Fashion-MNIST (the CIFAR-10 stand-in) IID / Dir 1.0 / Dir 0.5: {RS, SHA} x {None, FedEx, FedPop}
#   shakespeare  Table 2's Shakespeare columns, IID / NIID (one role per client): the same grid
#   table3       cross-silo feature shift, Digits and PACS (one domain per client): SHA x {None, FedEx, FedPop}
#   ablation     Table 4 on Fashion-MNIST: RS + FedPop-G only, RS + FedPop-L only (RS / None and RS + FedPop
#                are Table 2's runs, with the same settings)
#   scores       App. Table 5 on Fashion-MNIST: SHA + FedPop with the score rule avg / last (power-law is Table 2's)
#   reports      the markdown tables (benchmarks/fedpop_tables.py) and `fedhet report` per run name
# Every job skips a finished run (summary.json), resumes an interrupted one (a checkpoint: --resume) and starts
# again one that died before its first checkpoint (--overwrite), so the script can be stopped and restarted; a
# job that fails is reported and the others go on (the script exits 1 at the end, listing the failures).
# Seeds go outermost in each stage, so every cell gets seed 1 before any gets seed 2. One job at a time, one
# torch thread (run.num_threads: 1 in configs/fedpop/common.yaml). Cost per trial: docs/results/fedpop.md.
#   bash benchmarks/fedpop_tables.sh [table2|shakespeare|table3|ablation|scores|reports]
#   SEEDS=1 bash benchmarks/fedpop_tables.sh table2
#   ONLY=shk_niid bash benchmarks/fedpop_tables.sh shakespeare   # only jobs whose run directory contains ONLY
# Two drivers may share the machine (one core each) when their ONLY filters select disjoint jobs.
# Smoke test of every stage (tiny; what docs/results/fedpop.md reports):
#   PREFIX=fedpop_smoke RUNS=/tmp/fedpop_smoke OUT=/tmp/fedpop_smoke/tables SEEDS=1 EXTRA="rounds=3 \
#     tune.budget=null tune.configs=4 tune.eta=2 tune.eliminations=2 tune.g_interval=1.0 data.num_clients=20 \
#     data.max_train_per_client=20 eval.every=3" bash benchmarks/fedpop_tables.sh
# Needs FEDHET_DATA (default ../shared/data beside the checkout: tiny Shakespeare, Digits, PACS) and the Debian package
# dataset-fashion-mnist.
# With RUNS=runs (the default) finished jobs are kept in git (benchmarks/run_archive.py, docs/results/runs/): the
# script restores them first and saves each job when it ends, so the reproduction can span sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
PY=${PY:-.venv/bin/python}
export FEDHET_DATA=${FEDHET_DATA:-$(cd .. && pwd)/shared/data}  # default: the shared/ copy beside this checkout
RUNS=${RUNS:-runs}                  # where the run directories go
OUT=${OUT:-docs/results/fedpop}     # where the tables go
PREFIX=${PREFIX:-fedpop}            # run names: <PREFIX>_t2_iid, ...
SEEDS=${SEEDS:-1,2,3}
ONLY=${ONLY:-}                      # run only jobs whose run directory contains this text
read -r -a EXTRA <<< "${EXTRA:-}"   # overrides added to every job (smoke tests)
what=${1:-all}
CFG=configs/fedpop
FAILED=()  # a failed job is reported and the others go on; the script exits 1 at the end
ARCHIVE=$([[ $RUNS == runs ]] && echo yes || true)
if [[ -n $ARCHIVE ]]; then $PY benchmarks/run_archive.py restore; fi

declare -A TUNER=(
  [none]="tune.clients=fixed tune.fedpop_l=false tune.fedpop_g=false"
  [fedex]="tune.clients=fedex tune.fedpop_l=false tune.fedpop_g=false"
  [fedpop]="tune.clients=ball tune.fedpop_l=true tune.fedpop_g=true"
  [fedpop_g]="tune.clients=ball tune.fedpop_l=false tune.fedpop_g=true"
  [fedpop_l]="tune.clients=ball tune.fedpop_l=true tune.fedpop_g=false"
)
declare -A PART=(
  [iid]="data.partition=iid"
  [dir1]="data.partition=dirichlet data.alpha=1.0"
  [dir05]="data.partition=dirichlet data.alpha=0.5"
  [shk_niid]="data.partition=domain"
  [shk_iid]="data.partition=iid"  # data.num_clients: 100 in shakespeare.yaml
)
FMNIST_PARTS=(iid dir1 dir05)

# job CONFIG NAME DATASET WRAPPER TUNER SEED [LABEL_SUFFIX] -- [OVERRIDES...]: one tuning run, in
# $RUNS/NAME/DATASET/fedavg+WRAPPER+TUNER[+SUFFIX]/seedSEED (fedhet tune's own layout).
job() {
  local config=$1 name=$2 dataset=$3 wrapper=$4 tuner=$5 seed=$6 suffix=$7
  shift 8
  local label=fedavg+$wrapper+$tuner${suffix:++$suffix}
  local dir=$RUNS/$name/$dataset/$label/seed$seed mode=()
  [[ -z $ONLY || $dir == *"$ONLY"* ]] || return 0
  if [[ -f $dir/summary.json ]]; then
    echo "done     $dir"
    return
  elif [[ -f $dir/checkpoints/population.pt ]]; then
    mode=(--resume)
  elif [[ -d $dir ]]; then
    mode=(--overwrite)  # died before its first checkpoint
  fi
  echo "run      $dir ${mode[*]}"
  # shellcheck disable=SC2086  # the tuner's overrides are words
  if ! $FEDHET tune "$CFG/$config" name="$name" seed="$seed" label="$label" tune.wrapper="$wrapper" ${TUNER[$tuner]} \
      "$@" "${EXTRA[@]}" --run-dir "$dir" "${mode[@]}" -q > /dev/null; then
    echo "FAILED   $dir"
    FAILED+=("$dir")
  elif [[ -n $ARCHIVE ]]; then
    $PY benchmarks/run_archive.py save "$dir" > /dev/null
  fi
}

# grid CONFIG NAME DATASET "WRAPPERS" "TUNERS" [SUFFIX] -- [OVERRIDES...]: job for every seed, wrapper and tuner.
grid() {
  local config=$1 name=$2 dataset=$3 wrappers=$4 tuners=$5 suffix=$6
  shift 7
  for seed in ${SEEDS//,/ }; do
    for wrapper in $wrappers; do
      for tuner in $tuners; do
        job "$config" "$name" "$dataset" "$wrapper" "$tuner" "$seed" "$suffix" -- "$@"
      done
    done
  done
}

if [[ $what == all || $what == table2 ]]; then
  for p in "${FMNIST_PARTS[@]}"; do
    # shellcheck disable=SC2086
    grid fashion_mnist.yaml "${PREFIX}_t2_$p" fashion_mnist "rs sha" "none fedex fedpop" "" -- ${PART[$p]}
  done
fi
if [[ $what == all || $what == shakespeare ]]; then
  for p in shk_iid shk_niid; do
    # shellcheck disable=SC2086
    grid shakespeare.yaml "${PREFIX}_t2_$p" shakespeare "rs sha" "none fedex fedpop" "" -- ${PART[$p]}
  done
fi
if [[ $what == all || $what == table3 ]]; then
  grid digits.yaml "${PREFIX}_t3" digits "sha" "none fedex fedpop" "" --
  grid pacs.yaml "${PREFIX}_t3" pacs "sha" "none fedex fedpop" "" --
fi
if [[ $what == all || $what == ablation ]]; then
  for p in "${FMNIST_PARTS[@]}"; do
    # shellcheck disable=SC2086
    grid fashion_mnist.yaml "${PREFIX}_t2_$p" fashion_mnist "rs" "fedpop_g fedpop_l" "" -- ${PART[$p]}
  done
fi
if [[ $what == all || $what == scores ]]; then
  for p in "${FMNIST_PARTS[@]}"; do
    for score in avg last; do
      # shellcheck disable=SC2086
      grid fashion_mnist.yaml "${PREFIX}_t2_$p" fashion_mnist "sha" "fedpop" "$score" -- ${PART[$p]} \
        tune.score=$score
    done
  done
fi
if [[ $what == all || $what == reports ]]; then
  mkdir -p "$OUT"
  $PY benchmarks/fedpop_tables.py "$RUNS" --prefix "$PREFIX" --seeds "$SEEDS" --out "$OUT"
  for n in "$RUNS/${PREFIX}"_t*; do
    [[ -d $n ]] && $FEDHET report "$n" --out "$OUT/reports/$(basename "$n")" > /dev/null
  done
fi
if (( ${#FAILED[@]} )); then
  printf 'failed: %s\n' "${FAILED[@]}"
  exit 1
fi
