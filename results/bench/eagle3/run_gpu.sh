#!/bin/bash
# Session 14's cells for the drafts train_gpu.sh trained (published: EAGLE-3 and EAGLE-2, 1000 steps of 32 on 7400
# sequences): EAGLE-3 on core 1 and EAGLE-2 on core 0 at once (cells.sh, each core under its lock), 20 samples a
# cell, greedy, 128 new tokens. Two trees each: the method's default (top_k 4, depth 4, 15 nodes: the tau goal) and
# a 3-node tree (top_k 2, depth 1: the root's two best children and one grandchild), the best of a 5-sample sweep
# on GSM8K (docs/training.md). GSM8K, MT-Bench (both turns) and HumanEval on the default backend, then GSM8K on
# ggml_q8. Run dirs resume: rerun to finish. Table: python bench/suite_table.py results/bench/eagle3/runs
set -u
cd "$(dirname "$0")"
T3=method.top_k=2,method.depth=1,method.num_nodes=3
cells() {  # METHOD
  for task in gsm8k mt_bench humaneval; do
    echo "$task:$1:20:$task-$1-gpu" "$task:$1:20:$task-$1-gpu-t3:$T3"
  done
  echo "gsm8k:$1:20:gsm8k-$1-gpu-q8:model.backend=ggml_q8" "gsm8k:$1:20:gsm8k-$1-gpu-t3-q8:$T3,model.backend=ggml_q8"
}
CORE=1 bash cells.sh $(cells eagle3) &
CORE=0 bash cells.sh $(cells eagle) &
wait
# afterwards: the 3-node tree on another 20 GSM8K test questions (task.seed=1; the tree was picked on 5 of seed 0's)
# CORE=1 bash cells.sh "gsm8k:eagle3:20:gsm8k-eagle3-gpu-t3-seed1:$T3,task.seed=1"
# CORE=0 bash cells.sh "gsm8k:eagle:20:gsm8k-eagle-gpu-t3-seed1:$T3,task.seed=1"
# then ggml_q8 on MT-Bench and HumanEval, the 3-node tree only:
# CORE=1 bash cells.sh "mt_bench:eagle3:20:mt_bench-eagle3-gpu-t3-q8:$T3,model.backend=ggml_q8" "humaneval:eagle3:20:humaneval-eagle3-gpu-t3-q8:$T3,model.backend=ggml_q8"
# CORE=0 bash cells.sh "mt_bench:eagle:20:mt_bench-eagle-gpu-t3-q8:$T3,model.backend=ggml_q8" "humaneval:eagle:20:humaneval-eagle-gpu-t3-q8:$T3,model.backend=ggml_q8"
