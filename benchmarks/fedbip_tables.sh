#!/usr/bin/env bash
# FedBiP (Chen et al., CVPR 2025; spec fedbip.md; docs/results/fedbip.md): the structure of the paper's tables on CPU
# with the small LDM pretrained here. Stages, in this order unless one is named:
#   pretrain   the LDM (`fedhet ldm pretrain`, cached: a finished folder is returned at once) and its sample grid
#   feature    Table 1: feature shift, digit domains the LDM never saw, 16-shot; FedBiP x1/S/3x/M/L, prompt only,
#              FedAvg, Central (configs/fedbip/feature_shift.yaml)
#   ablation   Table 3: none / V / S / z(T) / all without perturbation / all (configs/fedbip/ablation.yaml)
#   fresh      issue 37: Table 1's FedBiP x1/S/3x/M/L again with start_latent=fresh (the official code's fresh start
#              latent per image, now the default) into runs/fedbip_digits_fresh; the runs above keep the old
#              behaviour (start_latent=upload: every copy restarts from one z(T))
#   ablation_fresh  issue 37: Table 3's rows with z(T) (zt_only, all_no_perturb, all) with start_latent=fresh into
#              runs/fedbip_ablation_fresh (the rows without z(T) do not depend on it)
#   baselines  issue 37: Table 1's one-shot baselines FedD3, FGL, FedDEO and DENSE (BASELINES, default
#              fedd3,fgl,feddeo,dense; all simplified, docs/fedbip.md) into runs/fedbip_digits; DENSE from
#              configs/fedbip/dense.yaml (it takes none of FedBiP's method_args), the others from feature_shift.yaml
#   label      Table 2: Fashion-MNIST, 5 clients, IID / Dirichlet 0.5 / Dirichlet 0.01 (configs/fedbip/label_shift.yaml)
#   privacy    Table 4: `fedhet privacy` (loss / entropy gaps) on FedBiP-L, FedAvg and Central of every table
#   reports    `fedhet report` per run name, the MIA and size tables and the real-vs-generated grids
#              (benchmarks/fedbip_tables.py)
# Sweeps skip finished runs and resume interrupted ones; generated images are cached (runs/fedbip_cache), so an
# interrupted generation regenerates only missing parts. SEEDS (default 1,2,3) and ABLATION_SEEDS (default 1).
# Finished runs and the LDM's VAE and UNet are kept in git (benchmarks/run_archive.py, docs/results/runs/): the script
# restores them first (the text encoder is the MiniLM package's, saved again into the folder) and saves each stage's
# runs when it ends, so a reproduction can span sessions on machines that start empty.
# Needs FEDHET_DATA (MNIST, MNIST-M, USPS) and the Debian package dataset-fashion-mnist.
#   bash benchmarks/fedbip_tables.sh [pretrain|feature|ablation|label|privacy|reports]
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
PY=${PY:-.venv/bin/python}
export FEDHET_DATA=${FEDHET_DATA:-$(cd .. && pwd)/shared/data}
OUT=docs/results/fedbip
what=${1:-all}
SEEDS=${SEEDS:-1,2,3}
ABLATION_SEEDS=${ABLATION_SEEDS:-1}
LABEL_SEEDS=${LABEL_SEEDS:-$SEEDS}
LDM=runs/ldm32
$PY benchmarks/run_archive.py restore
if [[ -f $LDM/fedhet_ldm.json && ! -d $LDM/text_encoder ]]; then
  $PY -c "from fedhet.models.ldm.checkpoint import minilm_text_encoder; minilm_text_encoder()[0].save_pretrained('$LDM/text_encoder')"
fi
save() { $PY benchmarks/run_archive.py save "$@"; }  # paths that do not exist are skipped

if [[ $what == all || $what == pretrain ]]; then
  $FEDHET ldm pretrain --out $LDM --minutes 80 num_threads=1 -q
  save $LDM/{vae,unet,tokenizer,scheduler}/* $LDM/fedhet_ldm.json $LDM/loss.csv
  [[ -f docs/images/fedbip_ldm.png ]] || $FEDHET ldm samples $LDM --out docs/images/fedbip_ldm.png --steps 20
fi
if [[ $what == all || $what == feature ]]; then
  $FEDHET sweep configs/fedbip/feature_shift.yaml --seeds "$SEEDS" -q
  save runs/fedbip_digits
fi
if [[ $what == all || $what == ablation ]]; then
  $FEDHET sweep configs/fedbip/ablation.yaml --seeds "$ABLATION_SEEDS" -q
  save runs/fedbip_ablation
fi
if [[ $what == baselines ]]; then
  baselines=",${BASELINES:-fedd3,fgl,feddeo,dense},"
  others=$(echo "$baselines" | tr , '\n' | grep -v -x -e dense -e '' | paste -sd, || true)
  if [[ -n $others ]]; then
    $FEDHET sweep configs/fedbip/feature_shift.yaml --methods "$others" --seeds "$SEEDS" -q
  fi
  if [[ $baselines == *,dense,* ]]; then
    $FEDHET sweep configs/fedbip/dense.yaml --seeds "$SEEDS" -q
  fi
  save runs/fedbip_digits
fi
if [[ $what == fresh ]]; then  # seed after seed, so each seed's size sweep is complete before the next starts
  for seed in ${SEEDS//,/ }; do
    $FEDHET sweep configs/fedbip/feature_shift.yaml name=fedbip_digits_fresh method_args.start_latent=fresh \
      --methods "${FRESH_METHODS:-fedbip_l,fedbip_m,fedbip_s,fedbip_x1,fedbip_x3}" --seeds "$seed" -q
    save runs/fedbip_digits_fresh
  done
fi
if [[ $what == ablation_fresh ]]; then
  $FEDHET sweep configs/fedbip/ablation.yaml name=fedbip_ablation_fresh method_args.start_latent=fresh \
    --methods zt_only,all_no_perturb,all --seeds "$SEEDS" -q
  save runs/fedbip_ablation_fresh
fi
if [[ $what == all || $what == label ]]; then
  $FEDHET sweep configs/fedbip/label_shift.yaml --seeds "$LABEL_SEEDS" -q
  $FEDHET sweep configs/fedbip/label_shift.yaml data.partition=dirichlet data.alpha=0.5 name=fedbip_fashion_dir05 \
    --seeds "$LABEL_SEEDS" -q
  $FEDHET sweep configs/fedbip/label_shift.yaml data.partition=dirichlet data.alpha=0.01 name=fedbip_fashion_dir001 \
    --seeds "$LABEL_SEEDS" -q
  save runs/fedbip_fashion_iid runs/fedbip_fashion_dir05 runs/fedbip_fashion_dir001
fi
if [[ $what == all || $what == privacy ]]; then
  # the attack needs the run's checkpoint, which the archive does not keep: privacy.json is archived instead, and
  # a restored run without either is reported (run its sweep again into a fresh folder to attack it)
  for run in runs/fedbip_digits/digits/{fedbip_l,fedavg,central}/seed* \
             runs/fedbip_fashion_*/fashion_mnist/{fedbip_l,fedavg,central}/seed*; do
    if [[ -f $run/summary.json && ! -f $run/privacy.json ]]; then
      if [[ -f $run/checkpoints/latest.pt ]]; then $FEDHET privacy "$run" -q; save "$run"
      else echo "no checkpoint: $run (archived without one; not attacked)"; fi
    fi
  done
fi
if [[ $what == all || $what == reports ]]; then
  mkdir -p $OUT
  for n in fedbip_digits fedbip_ablation fedbip_fashion_iid fedbip_fashion_dir05 fedbip_fashion_dir001; do
    if [[ -d runs/$n ]]; then $FEDHET report runs/$n --out $OUT/$n; fi
  done
  $PY benchmarks/fedbip_tables.py --out $OUT
fi
