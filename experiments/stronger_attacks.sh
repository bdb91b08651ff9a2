#!/usr/bin/env bash
# The stronger-attacks study (docs/results/stronger_attacks/README.md): every method, its controls and best-of-k
# at each method's compute, on 24 order-free sample questions, two model sizes. Resumable: rerunning continues.
#   BIN=.venv/bin OUT=docs/results/stronger_attacks experiments/stronger_attacks.sh
set -euo pipefail
BIN=${BIN:-.venv/bin}
OUT=${OUT:-docs/results/stronger_attacks}
MODELS=${MODELS:-smollm2-135m-instruct qwen2.5-coder-0.5b-instruct}
# best_of_k at each method's forward-equivalents (a backward ≈ 1.4–1.7 forwards here: atp-benchmark's
# fwd_bwd / fwd − 1): structured ≤ 5; frank_wolfe 20 + 2 backwards ≈ 24; evolution and structured_evolution 30;
# atp_joint 20 + 20 backwards ≈ 54.
ATTACKS="vanilla,best_of_k@k=5,structured,best_of_k,frank_wolfe,frank_wolfe_reversed,frank_wolfe_random"
ATTACKS+=",frank_wolfe@positions=soft,best_of_k@k=24,evolution,structured_evolution,best_of_k@k=30"
ATTACKS+=",atp_joint,atp_joint@positions=soft,best_of_k@k=54"
for model in $MODELS; do
  "$BIN/atp-attack" --model "$model" --num_examples 24 --max_rows 12 --max_cols 8 \
    --attacks "$ATTACKS" --output_dir "$OUT/$model"
done
