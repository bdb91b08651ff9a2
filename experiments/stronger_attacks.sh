#!/usr/bin/env bash
# The stronger-attacks study (docs/results/stronger_attacks/README.md): every method, its controls and best-of-k
# at each method's compute, on 24 order-free sample questions, two model sizes. Resumable: rerunning continues.
#   BIN=.venv/bin OUT=docs/results/stronger_attacks experiments/stronger_attacks.sh
set -euo pipefail
BIN=${BIN:-.venv/bin}
OUT=${OUT:-docs/results/stronger_attacks}
MODELS=${MODELS:-smollm2-135m-instruct qwen2.5-coder-0.5b-instruct}
# Best-of-k at each method's compute comes from one large best-of-k: its 64 recorded order losses give best-of-j
# exactly in expectation for every j ≤ 64 (`atp-report --compare --sampled_reference best_of_k@k=64`), each
# question at the method's own forwards there (a backward ≈ 1.4–1.7 forwards here: atp-benchmark's fwd_bwd / fwd
# − 1; atp_joint's 20 forwards + 20 backwards ≈ 54, under 64 with its final choice). best_of_k (20) stays as the
# paper's column. Every gradient method keeps its reversed and random-direction controls.
ATTACKS="vanilla,structured,best_of_k,frank_wolfe,frank_wolfe_reversed,frank_wolfe_random,frank_wolfe@positions=soft"
ATTACKS+=",evolution,structured_evolution,atp_joint,atp_st_reversed,atp_st_random,atp_joint@positions=soft"
ATTACKS+=",best_of_k@k=64"
for model in $MODELS; do
  "$BIN/atp-attack" --model "$model" --num_examples 24 --max_rows 12 --max_cols 8 \
    --attacks "$ATTACKS" --output_dir "$OUT/$model"
done
