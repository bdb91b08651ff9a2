#!/usr/bin/env bash
# Shape buckets before / after, paired question by question (docs/benchmarks/compiles.md, "Paired, in chunks"):
# for each question the commit before buckets (BEFORE, a git worktree) and this checkout run the paper's table on
# it back to back, the side that goes first alternating with the question's parity: the machine appeared to slow under
# sustained load (the matmul peak fell ≈ 20% within a pair), which handicaps the second run of a pair. A matmul
# peak before the first pair and after each one records it. Resumable: each folder skips the questions it holds.
#   git worktree add ../before c9720ac
#   BEFORE=../before FROM=8 TO=12 experiments/paired_buckets.sh
set -euo pipefail
BIN=${BIN:-.venv/bin}
BEFORE=${BEFORE:?"the commit before buckets as a worktree: git worktree add ../before c9720ac; BEFORE=../before"}
MODEL=${MODEL:-qwen2.5-coder-0.5b-instruct}
OUT=${OUT:-docs/benchmarks/compiles/qwen05_12q}
FROM=${FROM:?"the first question to pair (1-based, in the selection's order)"}
TO=${TO:-$FROM}
mkdir -p "${OUT}_before_paired" "${OUT}_after_paired"
peak() {
  printf '%s ' "$(date -u +%FT%TZ)" >> "${OUT}_after_paired/peaks.txt"
  "$BIN/atp-benchmark" --model "$MODEL" --variants matmul_peak --repeats 3 2>/dev/null \
    | grep -o 'matmul_peak_gflop_per_s | [0-9.]*' >> "${OUT}_after_paired/peaks.txt"
}
COMMON=(--model "$MODEL" --max_rows 12 --max_cols 8 --attacks paper_table --nogenerate --nocompilation_cache)
before() {  # $1: the question to pair (its --num_examples)
  # The script's own folder comes first on sys.path, then PYTHONPATH: the old package, not the installed one.
  PYTHONPATH="$BEFORE" /usr/bin/time -v -o "${OUT}_before_paired/time_q$1.txt" "$BIN/python" \
    "$BEFORE/experiments/run_attack.py" "${COMMON[@]}" --num_examples "$1" --output_dir "${OUT}_before_paired"
}
after() {
  /usr/bin/time -v -o "${OUT}_after_paired/time_q$1.txt" \
    "$BIN/atp-attack" "${COMMON[@]}" --num_examples "$1" --output_dir "${OUT}_after_paired"
}
peak
for n in $(seq "$FROM" "$TO"); do
  if (( n % 2 )); then before "$n"; after "$n"; else after "$n"; before "$n"; fi
  peak
done
