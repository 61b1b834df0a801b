#!/bin/bash
# One benchmark cell per argument, TASK:METHOD:N[:RUN_NAME[:OVERRIDES]] (OVERRIDES comma-separated), each on core
# $CORE (default 1) under that core's lock, default backend unless an override sets model.backend; greedy, 128 new
# tokens, one thread, no first-use training (methods that train). Run dirs resume: rerun to extend. Examples (session 13):
#   CORE=1 bash results/bench/eagle3/cells.sh gsm8k:hydra:20 "gsm8k:medusa:20:gsm8k-medusa:method.tree_from_accuracies=15"
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-/work/shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
OUT=results/bench/eagle3
CORE=${CORE:-1}
for cell in "$@"; do
  IFS=: read -r task m n name extra <<< "$cell"
  name=${name:-$task-$m}
  notrain=$(grep -q '^train_if_missing:' conf/method/$m.yaml && echo method.train_if_missing=false)  # trained methods only
  flock /work/core$CORE.lock taskset -c $CORE python -m specbench method=$m task=$task task.num_samples=$n \
    max_new_tokens=128 threads=1 progress=false $notrain run_dir=$OUT/runs/$name ${extra//,/ } \
    >> $OUT/run_$name.log 2>&1
  echo "$(date +%T) $name exit $?"
done
