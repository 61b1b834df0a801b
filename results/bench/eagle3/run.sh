#!/bin/bash
# EAGLE-3 (the recipe's draft: published, or cached by train.sh) vs EAGLE-2 (train.sh, same data and steps) on the
# embedded model, default backend (ggml, AVX2), greedy, 128 new tokens: GSM8K at 20 samples per method, then
# MT-Bench and HumanEval at 10 (the session's core time; raise N to extend: the run dirs resume). Each piece holds
# core 1's lock for at most ~11.5 minutes; a run directory keeps finished samples, so rerun this script until every
# run_*.log ends with its summary. Then: python bench/eagle_tree.py results/bench/eagle3/runs/<task>-<method>
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
OUT=results/bench/eagle3
for cell in gsm8k:eagle3:20 gsm8k:eagle:20 mt_bench:eagle3:10 humaneval:eagle3:10 mt_bench:eagle:10 humaneval:eagle:10; do
  IFS=: read -r task m n <<< "$cell"
  flock /work/core1.lock timeout 690 taskset -c 1 python -m specbench method=$m task=$task task.num_samples=$n \
    max_new_tokens=128 threads=1 progress=false method.train_if_missing=false run_dir=$OUT/runs/$task-$m \
    >> $OUT/run_$task-$m.log 2>&1
done
