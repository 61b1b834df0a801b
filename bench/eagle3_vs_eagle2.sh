#!/bin/bash
# Why EAGLE-3 drafts below EAGLE-2 at depth 1 (issue 44), measured at the CPU budget of EAGLE-3's 2 x 2
# (results/bench/general/README.md): the same general-domain mix, the same held-out split (the trainers' curves
# read its first 64 sequences, the same positions for both methods), 80 optimiser steps of 8, lr 1e-3, cosine,
# 5 warm-up steps, one seed, one thread on core CORE (default 1). The two methods differ in three ways, and
# each cell below removes one:
#   eagle2             EAGLE-2 as shipped: smooth-L1 regression to the target's next feature + 0.1 x the
#                      cross-entropy to the target's distribution, read out through the target's LM head
#   eagle2-cls         EAGLE-2 without the regression (cross-entropy only, weight 1): EAGLE-3's loss
#   eagle3-1-trained   EAGLE-3 with one unrolled step: EAGLE-2's depth-1-only objective
#   eagle3-1-full      the same with the whole 49,152-token vocabulary read out through the target's head:
#                      no draft-vocabulary ceiling, EAGLE-2's head
#   eagle3-7-trained   EAGLE-3 as the authors train it (7 steps, its own head): the 2 x 2's cell (ablation/), rerun beside the others
# Needs the mix's data, labels and EAGLE-3's feature taps in the cache (the first command of
# bench/recipe/train_general_cpu.sh makes them). Logs -> results/bench/general/eagle3_vs_eagle2/<cell>.log.json, then
# the table (held-out top-1 by depth at step 80; seconds per step of this run, one timing, shared host).
# CELLS="eagle2 eagle2-cls" runs a subset. Each cell's draft is kept in KEEP. Warning: a cell's draft lands in
# the cache under the name of the default draft's structure, so `checkpoint: auto` then loads it instead of the
# published one: run this with its own SPECBENCH_CACHE_DIR (with the mix's data and features), or delete
# $CACHE/eagle and $CACHE/eagle3 after.
set -eu
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
CACHE=${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}
OUT=results/bench/general/eagle3_vs_eagle2
KEEP=${KEEP:-$CACHE/eagle3_vs_eagle2}  # each cell's draft (not in the repository): bench/heldout_domains.py reads them
DATA="model=smollm2-135m model.backend=eager train.data.num_prompts=96 train.data.num_original=100
 train.data.general_prompts=700 train.data.max_new_tokens=160 train.data.batch_size=16 train.max_sequences=2000
 train.max_len=352"
STEPS="train.lr=1e-3 train.warmup_steps=5 train.max_steps=80 train.batch_size=8 train.eval_every=40"
ALL="eagle2 eagle2-cls eagle3-1-trained eagle3-1-full eagle3-7-trained"
for c in ${CELLS:-$ALL}; do
  [[ " $ALL " == *" $c "* ]] || { echo "eagle3_vs_eagle2.sh: error: CELLS names $c; allowed: $ALL" >&2; exit 2; }
done
overrides() {
  case $1 in
    eagle2) echo "method=eagle" ;;
    eagle2-cls) echo "method=eagle method.loss_reg=0 method.loss_cls=1" ;;
    eagle3-1-trained) echo "method=eagle3 method.ttt_steps=1 method.lm_head=trained" ;;
    eagle3-1-full) echo "method=eagle3 method.ttt_steps=1 method.lm_head=target method.draft_vocab_size=null" ;;
    eagle3-7-trained) echo "method=eagle3 method.ttt_steps=7 method.lm_head=trained" ;;
  esac
}
mkdir -p $OUT
for c in ${CELLS:-$ALL}; do
  kind=$(overrides $c | sed 's/method=\([a-z0-9]*\).*/\1/')
  t0=$(date +%s)
  taskset -c ${CORE:-1} python -m specbench.train threads=1 $(overrides $c) $DATA $STEPS
  echo "$c: $(( $(date +%s) - t0 )) s" | tee -a $OUT/times.txt
  log=$(ls -t "$CACHE/$kind"/smollm2-135m-*.log.json | head -1)
  cp "$log" $OUT/$c.log.json
  # cells of one method share a cache key (ttt_steps is not in it) and overwrite each other's draft: keep each
  mkdir -p "$KEEP" && cp "${log%.log.json}.safetensors" "$KEEP/$c.safetensors"
done
python - $OUT <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
times = dict(l.split(": ") for l in (out / "times.txt").read_text().splitlines())
print("| cell | data | depth 1 | 2 | 3 | 4 | 5 | 6 | 7 | s/step |\n|---|---|" + "---:|" * 8)
for p in sorted(out.glob("*.log.json")):
    d = json.loads(p.read_text())
    last = d["curve"][-1]
    acc = [f"{a:.3f}" for a in last["acceptance"]] + [""] * (7 - len(last["acceptance"]))
    steps = d["settings"]["steps"]
    sec = f"{int(times[p.name[:-9]].split()[0]) / steps:.1f}" if p.name[:-9] in times else ""
    print(f"| {p.name[:-9]} (step {last['step']}) | {d['settings']['data']['sha256']} | " + " | ".join(acc) + f" | {sec} |")
EOF
