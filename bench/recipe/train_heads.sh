#!/bin/bash
# Hydra++ (default), Medusa-1 and EESD trained by the recipe at EAGLE-3's budget (train.sh: the same 200 sequences,
# the same cached target features where the taps are a subset, 60 optimiser steps of 8, lr 2e-3, cosine schedule).
# Each runs on core 1 under the lock and resumes its last state (checkpoint_every=5): rerun until all three print
# their artifacts.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
DATA="model=smollm2-135m model.backend=eager threads=1 train.data.num_prompts=96 train.data.max_new_tokens=160
 train.data.num_original=200 train.max_sequences=200 train.max_len=320 train.max_steps=60 train.lr=2e-3
 train.checkpoint_every=5 train.eval_every=10"
for m in hydra medusa eesd; do
  flock /work/core1.lock taskset -c 1 python -m specbench.train method=$m $DATA
done
