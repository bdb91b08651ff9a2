#!/usr/bin/env bash
# The adversarial-training study (#41, the paper's A.9 defense): does training under adversarial orders shrink the
# attack's CE gain on held-out questions more than random-order augmentation, and at what cost to vanilla accuracy?
# One model per inner attack, trained on WTQ dev questions outside the bundled sample (--heldout sample), each
# exported and evaluated with generation on the sample's first order-free questions beside the base model, then one
# report of paired differences. Every step resumes (orbax checkpoints, recorded attacks), so rerunning continues.
# The inner attacks are shortened to about eight forwards each, as adversarial training's inner loops are (best-of-8,
# E-Search 2 x 4, ATP one restart of its 5 straight-through steps): on a 2-core CPU a SmolLM2 forward over a WTQ
# prompt takes seconds, and the full attacks would make the ATP run alone a day. STEPS=100 steps of 2 questions;
# under the constant schedule a run's length may change on resume, so a rerun with a larger STEPS continues each
# model from its last checkpoint (evaluate it into another OUT then: the eval folders name the model, not its step).
#   DATA_DIR=<folder with wtq/dev.jsonl> BIN=.venv/bin OUT=docs/results/adversarial_training experiments/adversarial_training.sh
set -euo pipefail
BIN=${BIN:-.venv/bin}
OUT=${OUT:-docs/results/adversarial_training}
RUNS=${RUNS:-results/adversarial_training}   # checkpoints and exported weights: large, kept out of docs/
DATA_DIR=${DATA_DIR:?set DATA_DIR to the folder holding wtq/dev.jsonl (or a WikiTableQuestions checkout)}
MODEL=${MODEL:-smollm2-135m-instruct}
STEPS=${STEPS:-100}
BATCH=${BATCH:-2}
# random, vanilla first: each model is set against the base, order augmentation and clean tuning
MODES=${MODES:-random vanilla best_of_k@k=8 evolution@population=2,generations=3 atp_joint@restarts=1}
SELECT=(--max_rows 12 --max_cols 8)
# Two sampling attacks (best-of-20, E-Search) and the gradient one (ATP's engineered recipe), so that a model trained
# against sampled orders is also attacked by a search it never saw; --remat for ATP's 4-restart backward. Attacks
# added here later are added to the finished folders on the next run (a folder takes new attacks on its questions).
EVAL=(--num_examples ${EVAL_N:-24} "${SELECT[@]}" --attacks vanilla,best_of_k,strongest,atp_joint --remat)

"$BIN/atp-attack" --model "$MODEL" "${EVAL[@]}" --output_dir "$OUT/base"
folders=$OUT/base
# --remat: without it a batch of two long prompts keeps every layer's attention scores (11.7 GB at 135M).
for mode in $MODES; do
  name=${mode//[@=,]/_}
  "$BIN/atp-train" --model "$MODEL" --dataset wtq --data_dir "$DATA_DIR" --num_examples ${TRAIN_N:-400} "${SELECT[@]}" \
    --inner "$mode" --steps "$STEPS" --batch_size "$BATCH" --learning_rate 5e-5 --warmup_steps 10 --remat \
    --checkpoint_every 10 --output_dir "$RUNS/$name"
  mkdir -p "$OUT/$name" && cp "$RUNS/$name/train_log.jsonl" "$RUNS/$name/run.json" "$RUNS/$name/skipped.json" "$OUT/$name/"
  # eval/<mode>: the report labels each model by its folder's name.
  "$BIN/atp-attack" --model "$RUNS/$name/model" "${EVAL[@]}" --output_dir "$OUT/eval/$name"
  folders+=",$OUT/eval/$name"
done
"$BIN/atp-report" --results "$folders" --robustness --robustness_references 3
