#!/usr/bin/env bash
# model.draft_quant=q8_0 beside float32 trained parts, for the trained methods other than EESD
# (session 56): GSM8K, the leaderboard's settings (20 samples, 128 tokens, greedy, the default
# backend `ggml`, one thread), each pair run at once on the two cores.
#   bash bench/draft_quant_rows.sh; python bench/suite_table.py results/bench/draft_quant
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/bench/draft_quant}
LOGS=${LOGS:-/tmp/draft_quant_logs}
mkdir -p "$OUT" "$LOGS"
declare -A ROW=(
  [eagle3-3node]="method=eagle3 method.top_k=2 method.depth=1 method.num_nodes=3"
  [vanilla_sd]="method=vanilla_sd"
  [hydra-3node]="method=hydra method.tree=[[0],[0,0],[1]]"
  [medusa-3node]="method=medusa method.tree_from_accuracies=3"
)
run() {  # core row variant
  local dir="$OUT/gsm8k/$2-$3" q=""
  [ "$3" = q8 ] && q="model.draft_quant=q8_0"
  [ -f "$dir/summary.json" ] && return 0
  # shellcheck disable=SC2086
  taskset -c "$1" python -m specbench ${ROW[$2]} task=gsm8k task.num_samples=20 max_new_tokens=128 threads=1 \
    progress=false method.train_if_missing=false run_dir="$dir" $q > "$LOGS/$2-$3.log" 2>&1
  echo "done $2 $3: $(grep -E '^speedup' "$LOGS/$2-$3.log" | cut -c1-60)"
}
for r in eagle3-3node vanilla_sd hydra-3node medusa-3node; do
  run 0 "$r" float & run 1 "$r" q8; wait
done
python bench/suite_table.py "$OUT"
