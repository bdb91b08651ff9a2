#!/usr/bin/env bash
# The three-size study (docs/results/scale/README.md): does the gradient's signal grow with model size, and
# can any attack beat sampling at equal compute on the 1.5B victim? Every step resumes where its records
# stop, so rerunning this script continues the study; STEPS picks the steps (default all).
#   BIN=.venv/bin OUT=docs/results/scale experiments/scale_study.sh
#   STEPS="3 4" nohup nice -n 19 experiments/scale_study.sh > scale_study.log 2>&1 &   # the long part, in the background
set -euo pipefail
BIN=${BIN:-.venv/bin}
OUT=${OUT:-docs/results/scale}
N=${NUM_EXAMPLES:-12}
STEPS=${STEPS:-1 2 3 4}
SELECT=(--num_examples "$N" --max_rows 12 --max_cols 8)
# On a CPU a forward costs the same per sequence alone or batched and quarter-octave rungs pad less: both shorten
# the attacks and change no record (docs/benchmarks/buckets.md), so a folder resumes across them.
CPU_SHAPES=(--candidate_batch 1 --bucket_steps 4)
VICTIM=qwen2.5-coder-1.5b-instruct
BENCH=docs/benchmarks/${VICTIM}_cpu2.json
step() { [[ " $STEPS " == *" $1 "* ]]; }

# 1. Forward and forward+backward times of the victim: a backward is counted as the forwards it costs.
if step 1 && [ ! -s "$BENCH" ]; then
  "$BIN/atp-benchmark" --model "$VICTIM" --variants fwd,fwd_bwd,matmul_peak --tokens 512 \
    --repeats 3 --json_out "$BENCH"
fi

# 2. The swap-rank diagnostic on the same order-free questions, three sizes.
if step 2; then
  for model in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct "$VICTIM"; do
    "$BIN/atp-swap-correlation" --model "$model" "${SELECT[@]}" --output_dir "$OUT/swap_rank/$model"
  done
fi

# 3. The paper's table on the victim, in the order the question needs it. (a) Losses only, first the attacks that
#    answer it on every question: vanilla, best-of-64 (its 64 recorded order losses give best-of-j at every budget
#    j <= 64, so every searching attack meets sampling at its own compute), the engineered ATP and E-Search
#    (`strongest`'s configuration, recorded under the name it has in the stronger-attacks folders so that
#    `--choose_strongest` pairs them); then the controls in the same folder: ATP's reversed control and the paper's
#    recipe (a folder takes added attacks on the same examples, so the passes share one table). (b) The answers
#    generated under vanilla's, E-Search's and atp_joint's orders, replayed from (a)'s records. --remat: ATP's
#    4-restart backward would otherwise keep every layer's attention scores (11 GB already at 135M on a 12 x 8 table).
ATTACKS=${ATTACKS:-vanilla,evolution,best_of_k@k=64,atp_joint}
CONTROLS=${CONTROLS:-atp_st_reversed,paper}
if step 3; then
  for attacks in "$ATTACKS" "$CONTROLS"; do
    "$BIN/atp-attack" --model "$VICTIM" "${SELECT[@]}" "${CPU_SHAPES[@]}" --remat --nogenerate \
      --attacks "$attacks" --output_dir "$OUT/${VICTIM}_attacks"
  done
  "$BIN/atp-transfer" --results "$OUT/${VICTIM}_attacks" --model "$VICTIM" --generate \
    --attacks vanilla,evolution,atp_joint --output_dir "$OUT/${VICTIM}_answers"
fi

# 4. The distinct orders ATP visits on the two smaller models (the victim's come from step 3).
if step 4; then
  for model in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct; do
    "$BIN/atp-attack" --model "$model" "${SELECT[@]}" --attacks paper,atp_joint --nogenerate \
      --output_dir "$OUT/${model}_atp_visits"
  done
fi
