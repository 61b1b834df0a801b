#!/bin/bash
# EAGLE-3 (the recipe's draft: published, or cached by train.sh) vs EAGLE-2 (train.sh, same data and steps) on the
# embedded model, default backend (ggml, AVX2), greedy, 128 new tokens, 20 samples per cell: GSM8K, then MT-Bench
# and HumanEval. Each piece holds core 1's lock for at most ~11.5 minutes; a run directory keeps finished samples,
# so rerun this script until every run_*.log ends with its summary.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
OUT=results/bench/eagle3
for task in gsm8k mt_bench humaneval; do
  for m in eagle3 eagle; do
    flock /work/core1.lock timeout 690 taskset -c 1 python -m specbench method=$m task=$task task.num_samples=20 \
      max_new_tokens=128 threads=1 progress=false method.train_if_missing=false run_dir=$OUT/runs/$task-$m \
      > $OUT/run_$task-$m.log 2>&1
  done
done
