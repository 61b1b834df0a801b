#!/bin/bash
# EAGLE-3 at four times train.sh's token budget: 800 sequences (the same 96 self-distilled GSM8K train prompts x3
# templates + 600 original train answers; 80 held out), 240 optimiser steps of 8 (the same ~2.7 epochs), the same
# lr and schedule. Does held-out acceptance keep rising with data? On core 0 (core 1 trains the heads meanwhile).
# The checkpoint's cache path depends on the draft's structure only: this run replaces train.sh's draft in the
# cache (the published one is untouched); copy it aside first if you want both.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
taskset -c ${CORE:-0} python -m specbench.train method=eagle3 method.ttt_steps=5 model=smollm2-135m model.backend=eager \
 threads=1 train.data.num_prompts=96 train.data.max_new_tokens=160 train.data.num_original=600 train.max_sequences=800 \
 train.max_len=320 train.max_steps=240 train.lr=2e-3 train.checkpoint_every=10 train.eval_every=20
