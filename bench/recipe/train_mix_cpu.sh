#!/bin/bash
# A trained part from the target on the GPU recipe's general mix at a larger CPU budget than train_general_cpu.sh's
# (issue 44): the same 3,200 sequences and held-out split as EESD's and the EAGLE fine-tunes' recipes
# (train.cap=spread of session 54's 10,400: ~58% GSM8K templates, 29% ShareGPT answers over 7 domains, 13% original
# GSM8K; 2,880 train / 320 held out). STEPS (default 600) optimiser steps of 8, cosine, 5 warm-up steps (the
# published CPU parts' schedule: 200 steps of 8 on 807 sequences).
#   METHOD=hydra (the default): Hydra++'s 3 heads x 4 blocks + the prefix layer, the target's LM head shared, lr 1e-3;
#     reads the "final" column of the features those recipes cache (no new prefill when they ran first).
#     Published since session 60: a resumed run stopped by MINUTES=58 at step 489 of 600 (the command in its .json).
#   METHOD=vanilla_sd: the vanilla-SD draft (the target's first 3 layers + final norm; embedding and head the
#     target's, frozen), lr 5e-4 (train_general_cpu.sh's); trained live, no features.
# THREADS (default 2) threads, niced. A rerun resumes (resume states every 25 steps). MINUTES=N adds the safety cap
# train.max_minutes=N (not part of the resume key). PUBLISH=1 ships it.
set -eu
METHOD=${METHOD:-hydra}
case $METHOD in
  hydra) OWN="method=hydra method.num_heads=3 train.lr=1e-3"; KIND=hydra ;;
  vanilla_sd) OWN="method=vanilla_sd method.draft.num_layers=3 train.lr=5e-4"; KIND=vanilla_draft ;;
  *) echo "train_mix_cpu.sh: error: METHOD=$METHOD (allowed: hydra, vanilla_sd)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=${THREADS:-2}
CACHE=${SPECBENCH_CACHE_DIR:-$HOME/.cache/specbench}
mkdir -p "$CACHE/distill"
DATA=$CACHE/distill/smollm2-135m-98362432-float32-adff70f4e995.json
[ -f "$DATA" ] || xz -dc results/bench/gpu_general/distill_gpu_general.json.xz > "$DATA"
CMD="python -m specbench.train $OWN model=smollm2-135m model.backend=eager threads=${THREADS:-2}
 train.data.num_prompts=6000 train.data.num_original=1400 train.data.max_new_tokens=192 train.data.batch_size=500
 train.data.general_prompts=3000 train.cap=spread train.max_sequences=3200 train.max_len=320 train.batch_size=8
 train.warmup_steps=5 train.max_steps=${STEPS:-600} train.checkpoint_every=25 train.eval_every=50
 ${MINUTES:+train.max_minutes=$MINUTES}"
nice -n 19 $CMD
[ "${PUBLISH:-0}" = 1 ] || exit 0
ck=$(ls -t "$CACHE/$KIND"/smollm2-135m-*.safetensors | grep -v resume | head -1)
python -m specbench.tools.publish "$ck" --command "$(echo $CMD)"
