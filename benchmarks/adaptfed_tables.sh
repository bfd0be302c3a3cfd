#!/usr/bin/env bash
# AdaptFED (docs/results/adaptfed.md): the stand-in pretrained backbones, then the structure of Tables 2/4 (AdaptFED
# + ten baselines x {pathological, Dirichlet 0.3} x {50, 100 clients}), Table 9 (which component is generated),
# Table 8 (novel clients, then the whole-hypernetwork adaptation of the trained runs), Table 10 (Dirichlet alpha
# sweep, 100 clients), AdaptFED's variants (factor-only LoRA, task-aware, +FedPER, the hypernetwork's step size),
# Table 6 (Shakespeare), Fed-SFDA on PACS from the ImageNet EfficientNet-Lite0, and the paper-layout tables. Sweeps skip finished runs and resume interrupted ones, so the
# script can be stopped and restarted; stages run in this order unless one is named. SEEDS=1 runs seed 1 only.
# Finished runs and the pretrained backbones are kept in git (benchmarks/run_archive.py, docs/results/runs/): the
# script restores them first and saves each stage's runs when it ends, so a reproduction can span sessions.
# Needs FEDHET_DATA (MNIST for the pretraining) and the Debian package dataset-fashion-mnist.
#   bash benchmarks/adaptfed_tables.sh [pretrain|tables|tables100|personalize|novel|alpha|variants|shakespeare|sfda|reports]
set -euo pipefail
cd "$(dirname "$0")/.."
FEDHET=${FEDHET:-.venv/bin/fedhet}
PY=${PY:-.venv/bin/python}
OUT=docs/results/adaptfed
what=${1:-all}
SEEDS=${SEEDS:-1,2,3}
DIR03="data.partition=dirichlet data.alpha=0.3"
C100="data.num_clients=100 data.max_train_per_client=100"
$PY benchmarks/run_archive.py restore
save() { $PY benchmarks/run_archive.py save "$@"; }  # paths that do not exist are skipped

if [[ $what == all || $what == pretrain ]]; then
  for m in focalnet vit small_cnn; do
    [[ -f runs/adaptfed/${m}_mnist.pt ]] || $FEDHET pretrain configs/adaptfed/pretrain.yaml model.name=$m \
      --out runs/adaptfed/${m}_mnist.pt --epochs 40 --minutes 7
    save runs/adaptfed/${m}_mnist.pt
  done
fi
if [[ $what == all || $what == tables ]]; then
  $FEDHET sweep configs/adaptfed/tables.yaml --seeds "$SEEDS" -q
  $FEDHET sweep configs/adaptfed/tables.yaml $DIR03 name=adaptfed_dir03 --seeds "$SEEDS" -q
  save runs/adaptfed_path50 runs/adaptfed_dir03
fi
if [[ $what == all || $what == tables100 ]]; then
  $FEDHET sweep configs/adaptfed/tables.yaml $C100 name=adaptfed_path100 --seeds "$SEEDS" -q
  $FEDHET sweep configs/adaptfed/tables.yaml $C100 $DIR03 name=adaptfed_dir03_100 --seeds "$SEEDS" -q
  save runs/adaptfed_path100 runs/adaptfed_dir03_100
fi
if [[ $what == all || $what == personalize ]]; then
  $FEDHET sweep configs/adaptfed/personalize.yaml --seeds "$SEEDS" -q
  $FEDHET sweep configs/adaptfed/personalize.yaml $DIR03 name=adaptfed_dir03 --seeds "$SEEDS" -q
  save runs/adaptfed_path50 runs/adaptfed_dir03
fi
if [[ $what == all || $what == novel ]]; then
  $FEDHET sweep configs/adaptfed/novel.yaml --seeds "$SEEDS" -q
  for run in runs/adaptfed_novel/fashion_mnist/{adaptfed,pfedhn_t}/seed*; do
    $PY -c "import json,sys; sys.exit('hypernetwork' in json.load(open('$run/novel.json')))" \
      && $FEDHET adapt "$run" novel.part=hypernetwork -q
  done
  save runs/adaptfed_novel
fi
if [[ $what == all || $what == alpha ]]; then
  for a in 0.1 0.5 0.9 0.7; do  # the paper's columns first; alpha 0.3 is the tables100 stage's adaptfed_dir03_100
    $FEDHET sweep configs/adaptfed/alpha.yaml data.alpha=$a name=adaptfed_alpha$a --seeds "$SEEDS" -q
    save runs/adaptfed_alpha$a
  done
fi
if [[ $what == all || $what == variants ]]; then
  $FEDHET sweep configs/adaptfed/variants.yaml --seeds "$SEEDS" -q
  save runs/adaptfed_path50
fi
if [[ $what == all || $what == shakespeare ]]; then
  $FEDHET sweep configs/adaptfed/shakespeare.yaml --seeds "$SEEDS" -q
  save runs/adaptfed_shakespeare
fi
if [[ $what == all || $what == sfda ]]; then  # 5 pre-training epochs at 64 px: about 12 min a run on one core
  sfda_run() {  # NAME [OVERRIDES...]: one Fed-SFDA run from the ImageNet EfficientNet-Lite0, skipped when finished
    local name=$1 dir=runs/$1/pacs/fed_sfda/seed0
    shift
    local resume=$([[ -n $(ls $dir/checkpoints 2>/dev/null) ]] && echo --resume || true)
    [[ -f $dir/summary.json ]] || $FEDHET run configs/adaptfed/sfda_pacs.yaml $resume \
      model.name=efficientnet_lite0 model.pretrained=true data.image_size=64 method_args.source.image_size=64 \
      method_args.pretrain_epochs=5 name=$name "$@" -q
    save runs/$name
  }
  sfda_run sfda_pacs_effnet
  sfda_run sfda_pacs_effnet_kdsource method_args.kd_teacher=source
  sfda_run sfda_pacs_effnet_ladd method_args.kd_teacher=source method_args.lambda_kd=10 method_args.t_start=5
  sfda_run sfda_pacs_effnet_bnsource method_args.kd_teacher=source method_args.bn_stats=source
  # the client step size and EfficientNet's train-mode noise (benchmarks/sfda_probe.py; docs/results/adaptfed.md)
  low_lr="method_args.kd_teacher=source train.lr=0.001 method_args.pretrain_lr=0.01"
  sfda_run sfda_pacs_effnet_lr001 $low_lr
  sfda_run sfda_pacs_effnet_nodrop_lr001 $low_lr model.args.dropout=0 model.args.drop_connect_rate=0
fi
if [[ $what == all || $what == reports ]]; then
  mkdir -p $OUT
  # 50 clients: tables.md when the main sweep's runs are here; the runs of 2026-11-20..24 were made before the
  # archive existed, so a later session's 50-client rows (Table 9 on Dirichlet, the variants' seeds) go to extra50.md
  tables=$(for n in adaptfed_path50 adaptfed_dir03; do if [[ -d runs/$n ]]; then echo runs/$n; fi; done)
  table50=$([[ -d runs/adaptfed_path50/fashion_mnist/local_t ]] && echo tables.md || echo extra50.md)
  if [[ -n $tables ]]; then $PY benchmarks/adaptfed_tables.py $tables --out $OUT/$table50; fi
  tables=$(for n in adaptfed_path100 adaptfed_dir03_100; do if [[ -d runs/$n ]]; then echo runs/$n; fi; done)
  if [[ -n $tables ]]; then $PY benchmarks/adaptfed_tables.py $tables --out $OUT/tables100.md; fi
  if [[ -d runs/adaptfed_novel ]]; then $PY benchmarks/adaptfed_tables.py runs/adaptfed_novel --novel --out $OUT/novel.md; fi
  alphas=() headers=()
  for a in 0.1 0.3 0.5 0.7 0.9; do
    n=$([[ $a == 0.3 ]] && echo adaptfed_dir03_100 || echo adaptfed_alpha$a)
    if [[ -d runs/$n ]]; then alphas+=(runs/$n) headers+=("alpha $a"); fi
  done
  if (( ${#alphas[@]} )); then
    $PY benchmarks/adaptfed_tables.py "${alphas[@]}" --headers "$(IFS=,; echo "${headers[*]}")" --out $OUT/alpha.md
  fi
  if [[ -d runs/adaptfed_shakespeare ]]; then
    $PY benchmarks/adaptfed_tables.py runs/adaptfed_shakespeare --out $OUT/shakespeare.md
  fi
  for n in adaptfed_path100 adaptfed_dir03_100 adaptfed_novel adaptfed_shakespeare sfda_pacs_effnet; do
    if [[ -d runs/$n ]]; then $FEDHET report runs/$n --out $OUT/$n; fi
  done
fi
