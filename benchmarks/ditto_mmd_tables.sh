#!/usr/bin/env bash
# Ditto + adaptive MMD constraints: the structure of the paper's Tables 1 and 2 (docs/results/ditto_mmd.md) on
# Fed-Heart-Disease, Synthetic (2 levels), Fashion-MNIST Dirichlet (3 alphas) and Real Digits; 10 rows x 3 seeds
# each (configs/ditto_mmd/rows.yaml); the ablations of Fig. 3 (fixed kernels on Synthetic, constraint depth on
# Fashion-MNIST alpha 0.5); then one report folder per set in docs/results/ditto_mmd/ and the cost per
# local step. SEEDS=0 runs seed 0 only (a quick look). Sweeps skip finished runs
# and resume interrupted ones, so the script can be stopped and restarted.
#   FEDHET_DATA=/path/to/shared/data bash benchmarks/ditto_mmd_tables.sh \
#       [heart|synthetic|fmnist|digits|digits_cnn|ablations|cost|reports]
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
PY=${PY:-.venv/bin/python}
OUT=docs/results/ditto_mmd
what=${1:-all}
SEEDS=${SEEDS:-0,1,2}
sweep() { $FEDHET sweep "$@" --seeds "$SEEDS" --quiet > /dev/null; }

if [[ $what == all || $what == heart ]]; then sweep configs/ditto_mmd/heart_disease.yaml; fi
if [[ $what == all || $what == synthetic ]]; then sweep configs/ditto_mmd/synthetic.yaml; fi
if [[ $what == all || $what == fmnist ]]; then
  for a in 0.1 0.5 5.0; do sweep configs/ditto_mmd/fashion_mnist.yaml "name=ditto_mmd_fmnist_a$a" "data.alpha=$a"; done
fi
if [[ $what == all || $what == digits ]]; then sweep configs/ditto_mmd/digits.yaml; fi
if [[ $what == all || $what == digits_cnn ]]; then  # the feature-shift probe with the FedBN paper's CNN (seed 0 here)
  sweep configs/ditto_mmd/digits_cnn.yaml --methods fedavg,ditto,cos,mmdd,mkmmd20
fi
if [[ $what == all || $what == ablations ]]; then
  sweep configs/ditto_mmd/synthetic_fixed_kernels.yaml --methods fixed1,fixed5,fixed10,fixed19
  sweep configs/ditto_mmd/fashion_mnist_depth.yaml name=ditto_mmd_fmnist_a0.5 data.alpha=0.5 \
    --methods ditto_mkmmd20_depth2,ditto_mkmmd20_depth3,ditto_mmdd_depth2,ditto_mmdd_depth3
fi
if [[ $what == all || $what == cost ]]; then
  $PY benchmarks/ditto_mmd_cost.py --out $OUT/cost_synthetic.json
fi
rows="fedavg ditto cos mmdd mkmmd20 mkmmd-1 ditto_cos ditto_mmdd ditto_mkmmd20 ditto_mkmmd-1 fixed1 fixed5 fixed10
  fixed19 ditto_mkmmd20_depth2 ditto_mkmmd20_depth3 ditto_mmdd_depth2 ditto_mmdd_depth3"
report() { local out=$1 root=$2; [[ -d $root ]] || return 0
  $FEDHET report $(for r in $rows; do [[ -d $root/$r ]] && echo "$root/$r"; done) --out "$OUT/$out"; }
report heart runs/ditto_mmd_heart/heart_disease
report synthetic_a0_b0 runs/ditto_mmd_synthetic/synthetic_a0_b0
report synthetic_a05_b05 runs/ditto_mmd_synthetic/synthetic_a05_b05
for a in 0.1 0.5 5.0; do report fmnist_a$a runs/ditto_mmd_fmnist_a$a/fashion_mnist; done
report digits runs/ditto_mmd_digits/digits
report digits_cnn runs/ditto_mmd_digits_cnn/digits
