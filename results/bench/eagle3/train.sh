#!/bin/bash
# The published EAGLE-3 draft for the embedded model (SmolLM2-135M), trained by the recipe (docs/training.md):
# self-distilled answers to 96 GSM8K *train* prompts (x3 templates) + 200 original train answers, 200 sequences
# in all (20 held out), the target's greedy labels and its features (one prefill, cached), 60 optimiser steps of 8.
# Runs on core 1 under the lock in pieces of at most ~11.5 minutes; each piece resumes the last (resume states
# every 5 steps), so rerun this script until it prints the artifact's path. model.backend=eager: training uses
# torch's float32 kernels (the same float32 model as the default ggml backend, faster to train through).
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
ARGS="method=eagle3 model=smollm2-135m model.backend=eager threads=1 train.data.num_prompts=96 train.data.max_new_tokens=160
 train.data.num_original=200 train.max_sequences=200 train.max_len=320 train.max_steps=60 train.lr=2e-3
 train.checkpoint_every=5 train.eval_every=10 method.ttt_steps=5"
flock /work/core1.lock timeout 690 taskset -c 1 python -m specbench.train $ARGS
