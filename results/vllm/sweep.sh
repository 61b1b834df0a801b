#!/bin/sh
# The committed vLLM batch sweep (results/vllm/README.md): 16 GSM8K prompts, greedy, 128 new tokens, batch 1..16,
# AR + one method per command (each holds the shared core-1 lock for at most ~11 minutes; re-running resumes).
# usage: sh results/vllm/sweep.sh ngram|suffix [override ...]   (e.g. overwrite=true: start afresh)
set -eu
cd "$(dirname "$0")/../.."
m="$1"; shift
# suffix: its global tree would learn each prompt's output at one batch size and replay it at the next (the same
# prompts run at every size): no global tree across requests, so each batch size sees only its own prompt and output
extra=""; [ "$m" = suffix ] && extra="method.max_cached_requests=0"
flock /work/core1.lock taskset -c 1 python -m specbench engine=vllm method="$m" task=gsm8k task.num_samples=16 \
    max_new_tokens=128 'engine.batch_sizes=[1,2,4,8,16]' engine.timeout_s=600 progress=false \
    run_dir=results/vllm/runs/gsm8k-"$m" $extra "$@"
