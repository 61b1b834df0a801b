#!/usr/bin/env bash
# EESD's draft cost on ggml_q8 (issue 44's stretch goal: EESD >= 1.0x on GSM8K on ggml_q8), session 56.
#   bash bench/eesd_draft_cost.sh            # ~25 min on two free cores; then the table:
#   python bench/suite_table.py results/bench/eesd_draft
# Variants (all: the published exit layer + Cali-TS predictor, model.backend=ggml_q8, one thread per
# run, two runs at a time, each pinned to its own core):
#   paper   the full 49k-row head, the exit layer in float32 (the fp32 kernel)
#   q8      + model.draft_quant=q8_0: the exit layer rounded to Q8_0 blocks, run on the int8 kernel
#   q8-v8k  + method.draft_vocab.size=8192 over results/bench/eesd/draft_vocab_mix.json
#           (the GPU recipe's general mix, bench/rank_draft_vocab.py)
#   q8-v16k + the same with 16384 tokens
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/bench/eesd_draft}
N=${N:-20}
LOGS=${LOGS:-/tmp/eesd_draft_logs}  # each run's printed summary (not kept in the repository)
RANK=results/bench/eesd/draft_vocab_mix.json
declare -A V=(
  [paper]=""
  [q8]="model.draft_quant=q8_0"
  [q8-v8k]="model.draft_quant=q8_0 method.draft_vocab.size=8192 method.draft_vocab.source=$RANK"
  [q8-v16k]="model.draft_quant=q8_0 method.draft_vocab.size=16384 method.draft_vocab.source=$RANK"
)
CELLS=()
for v in paper q8 q8-v8k q8-v16k; do CELLS+=("gsm8k $v"); done
for t in mt_bench xsum humaneval; do for v in q8 q8-v8k; do CELLS+=("$t $v"); done; done
run() {  # core task variant
  local dir="$OUT/$2/eesd-$3"
  [ -f "$dir/summary.json" ] && return 0
  # shellcheck disable=SC2086
  taskset -c "$1" python -m specbench method=eesd control=cali_ts task="$2" task.num_samples="$N" \
    model.backend=ggml_q8 threads=1 progress=false run_dir="$dir" ${V[$3]} > "$LOGS/$2-$3.log" 2>&1
  echo "done $2 $3: $(grep -E '^speedup' "$LOGS/$2-$3.log" | cut -c1-60)"
}
mkdir -p "$OUT" "$LOGS"
i=0
for cell in "${CELLS[@]}"; do
  run $((i % 2)) $cell &
  i=$((i + 1))
  if [ $((i % 2)) -eq 0 ]; then wait; fi
done
wait
python bench/suite_table.py "$OUT"
