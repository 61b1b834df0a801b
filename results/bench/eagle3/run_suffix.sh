#!/bin/bash
# SuffixDecoding (the training-free suite's one winner on the AMD host) on session 14's host, so that the EAGLE-2/3
# cells of run_gpu.sh have a training-free baseline measured on the same machine: 20 samples per task, greedy,
# 128 new tokens, one thread, one core each under its lock (as cells.sh).
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
OUT=results/bench/eagle3
cell() {  # CORE TASK
  flock /work/core$1.lock taskset -c $1 python -m specbench method=suffix task=$2 task.num_samples=20 max_new_tokens=128 \
    threads=1 progress=false run_dir=$OUT/runs/$2-suffix >> $OUT/run_$2-suffix.log 2>&1
  echo "$(date +%T) $2-suffix exit $?"
}
{ cell 1 gsm8k; cell 1 humaneval; } &
cell 0 mt_bench &
wait
