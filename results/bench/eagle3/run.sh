#!/bin/bash
# EAGLE-3 vs EAGLE-2 on GSM8K, embedded model (SmolLM2-135M), 5 samples, greedy, 128 new tokens at most.
# Each draft is trained on first use with the same budget (train.first_use) by a 1-sample warm-up run,
# then measured; every piece takes core 1's lock on its own (resumable: a run directory keeps finished samples).
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
OUT=results/bench/eagle3
for m in eagle3 eagle; do
  flock /work/core1.lock timeout 700 taskset -c 1 python -m specbench method=$m task=gsm8k task.num_samples=1 \
    max_new_tokens=8 profile.enabled=false threads=1 progress=false run_dir=/tmp/eagle3_bench_firstuse_$m \
    > $OUT/firstuse_$m.log 2>&1
done
for m in eagle3 eagle; do
  flock /work/core1.lock timeout 700 taskset -c 1 python -m specbench method=$m task=gsm8k task.num_samples=5 \
    max_new_tokens=128 threads=1 progress=false run_dir=$OUT/runs/gsm8k-$m > $OUT/run_$m.log 2>&1
done
