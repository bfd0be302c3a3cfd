#!/usr/bin/env bash
# 100 clients end to end (issue 6's comparison, issue 5's simulation): Fashion-MNIST, Dirichlet(0.5) over 100
# clients, 10 sampled per round, configs/flower_sim_100.yaml shortened to ROUNDS rounds (evaluation of all 100
# clients every 5 rounds). The same config and seed runs sequentially in-process, batched in-process, and on
# Flower's simulation engine (Ray, 2 CPUs, one actor per CPU); FedAvg on all three, Ditto on two.
# Wall times and accuracies are collected by benchmarks/e2e_table.py into docs/results/e2e_100_clients.md.
#   bash benchmarks/e2e_100_clients.sh                    # ~10 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
ROUNDS=${ROUNDS:-20}
OUT=${OUT:-runs/e2e_100}
CFG=configs/flower_sim_100.yaml
common=("rounds=$ROUNDS" "eval.every=5" "run.out_dir=$OUT")
timed() {  # label command...: append "label seconds" (whole process, start-up included) to wall_times.txt
  local label=$1 t0; shift; t0=$(date +%s%N); "$@"
  echo "$label $(( ($(date +%s%N) - t0) / 1000000 ))e-3" >> "$OUT/wall_times.txt"
}
mkdir -p "$OUT"; : > "$OUT/wall_times.txt"
timed fedavg_sequential $FEDHET run $CFG "${common[@]}" label=fedavg_sequential --quiet
timed fedavg_batched $FEDHET run $CFG "${common[@]}" label=fedavg_batched run.runtime=batched --quiet
timed fedavg_flower_sim $FEDHET flower simulate $CFG "${common[@]}" label=fedavg_flower_sim --num-cpus 2 \
  --cpus-per-client 1 --run-dir "$OUT/flower_sim_100/fashion_mnist/fedavg_flower_sim/seed0" --quiet
timed ditto_sequential $FEDHET run $CFG "${common[@]}" method=ditto method_args.lam=0.1 label=ditto_sequential --quiet
timed ditto_flower_sim $FEDHET flower simulate $CFG "${common[@]}" method=ditto method_args.lam=0.1 \
  label=ditto_flower_sim --num-cpus 2 --cpus-per-client 1 \
  --run-dir "$OUT/flower_sim_100/fashion_mnist/ditto_flower_sim/seed0" --quiet
cat "$OUT/wall_times.txt"
