#!/bin/bash
# The EAGLE drafts fine-tuned on the general-domain mix on this CPU (issue 44): METHOD=eagle3 (the default; the
# draft published since session 59) or METHOD=eagle (EAGLE-2's head, published since session 60). Each starts from
# the draft the GPU recipe trained on GSM8K prompts only (session 14: 1000 steps of 32 on 6,660 sequences; EAGLE-3
# with ttt 5 and the target's head; published until session 59, restored from git below) and continues on the GPU
# recipe's general mix (session 54's 10,400 sequences: 7,400 GSM8K, 3,000 answers to ShareGPT prompts over 7
# domains), capped at 3,200 with train.cap=spread (each source keeps its share; the same sequences and held-out
# split as EESD's recipe, train_eesd_cpu.sh). EAGLE-3's vocabulary maps become the mix's (lm_head=target: the head
# is the target's rows at them); fc and the decoder layer start from the draft. 1000 optimiser steps of 8 (~2.8
# passes), lr 3e-4 cosine, 5 warm-up steps (EAGLE-2: 600 steps, its STEPS default); two threads, niced (session 59,
# a 2-core Intel Xeon VM, EAGLE-3: the features prefill ~18 min with the teacher labels cached from EESD's run, the
# 1000 steps ~48 min at ~2.9 s a step; EAGLE-2 reads the "final" column of the same features).
# A rerun resumes (resume states every 25 steps). PUBLISH=1 ships it.
set -eu
# the GSM8K-only draft this fine-tune starts from: the one published before session 59
METHOD=${METHOD:-eagle3}
case $METHOD in
  eagle3) FILE=eagle3/smollm2-135m-98362432-float32-f38b4aa6c8.safetensors; OWN="method.ttt_steps=5"; N=1000 ;;
  eagle) FILE=eagle/smollm2-135m-98362432-float32-c35b9e3700.safetensors; OWN=""; N=600 ;;
  *) echo "finetune_eagle_cpu.sh: error: METHOD=$METHOD (allowed: eagle3, eagle)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=${THREADS:-2}
CACHE=${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}
mkdir -p "$CACHE/distill" "$CACHE/init"
DATA=$CACHE/distill/smollm2-135m-98362432-float32-adff70f4e995.json
[ -f "$DATA" ] || xz -dc results/bench/gpu_general/distill_gpu_general.json.xz > "$DATA"
INIT=$CACHE/init/$METHOD-gsm8k-s14.safetensors
[ -f "$INIT" ] || git show 9a79033:specbench/published_artifacts/smollm2-135m-98362432-float32/$FILE > "$INIT"
CMD="python -m specbench.train method=$METHOD $OWN model=smollm2-135m model.backend=eager threads=${THREADS:-2}
 train.data.num_prompts=6000 train.data.num_original=1400 train.data.max_new_tokens=192 train.data.batch_size=500
 train.data.general_prompts=3000 train.cap=spread train.max_sequences=3200 train.max_len=320 train.batch_size=8
 train.init=$INIT train.lr=3e-4 train.warmup_steps=5 train.max_steps=${STEPS:-$N} train.checkpoint_every=25
 train.eval_every=50"
nice -n 19 $CMD
[ "${PUBLISH:-0}" = 1 ] || exit 0
ck=$(ls -t "$CACHE/$METHOD"/smollm2-135m-*.safetensors | grep -v resume | head -1)
python -m specbench.tools.publish "$ck" --command "$(echo $CMD)" \
  --note "train.init: git show 9a79033:specbench/published_artifacts/smollm2-135m-98362432-float32/$FILE (sha256 $(sha256sum "$INIT" | cut -c1-16)...; bench/recipe/finetune_eagle_cpu.sh restores it)"
