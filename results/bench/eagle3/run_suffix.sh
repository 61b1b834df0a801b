#!/bin/bash
# SuffixDecoding (the training-free suite's one winner on the AMD host) on session 14's host, so that the EAGLE-2/3
# cells of run_gpu.sh have a training-free baseline measured on the same machine: 20 samples per task, greedy,
# 128 new tokens, one thread, one core each under its lock (cells.sh).
set -u
cd "$(dirname "$0")"
CORE=1 bash cells.sh gsm8k:suffix:20:gsm8k-suffix humaneval:suffix:20:humaneval-suffix &
CORE=0 bash cells.sh mt_bench:suffix:20:mt_bench-suffix &
wait
