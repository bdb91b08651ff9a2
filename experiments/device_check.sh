#!/bin/bash
# What an accelerator changes, checked in one go (under 10 minutes on one H200): what compiling costs a sweep
# there (the paper's table over sample questions, cold and on a warm persistent cache), the
# tests whose numbers a GPU can move (the decoder against transformers, the attack's exactness), then the speed
# of a 1B-shaped model in bfloat16: one ATP step of 8 restarts, and one whole attack of that size.
#
#   experiments/device_check.sh [OUT_DIR]          # from the repository root; figures land in OUT_DIR
#
# Needs the project installed with its test extra (pip install -e '.[cuda12,dev]') or, on a machine with JAX,
# flax, transformers and torch already there, gguf added (carried as a wheel: set WHEELS=DIR). The tests and the
# sweep use SmolLM2's tokenizer from the zoo; a machine that can fetch nothing takes a saved copy instead, made
# where the zoo is at hand and carried along:
#   python -c "from atp_jax.models import gguf, zoo; gguf.load_gguf_tokenizer(zoo.resolve('smollm2-135m-instruct')).save_pretrained('tok')"
#   TOKENIZER=tok experiments/device_check.sh
#
# The sweep's model has the zoo model's shape and random weights (SWEEP_MODEL, a `config:` name): compile counts
# and seconds depend on the shapes, not the weights, and a machine that can fetch nothing has no zoo weights. It
# runs without generation, in processes over one fresh persistent cache: "cold" compiles, "warm" reruns the same
# questions, and with SWEEP_BATCH > 1 "batched" runs them that many at a time (--batch_examples: new programs).
# Its records land in OUT_DIR/sweep.tgz; docs/benchmarks/compiles.md ("On one H200") has the first run's.
#
# Numerics: on recent NVIDIA GPUs JAX's default float32 matmul is TF32 (a 10-bit mantissa, about 1e-3 relative),
# which the tests' tolerances (1e-4 against PyTorch's float32, 1e-5 between meshes) do not allow; they run with
# JAX_DEFAULT_MATMUL_PRECISION=highest (true float32 products). The sweep and the benchmark run with the default
# precision, as a real run does (their models are bfloat16 anyway).
#
# Every step runs under what is left of DEADLINE_S (whole seconds for the script) and its own cap; a step cut
# short keeps what it wrote. Environment: PYTHON (python3), DEADLINE_S (570), SWEEP_MODEL (config:smollm2-135m),
# SWEEP_N (12 questions), SWEEP_BATCH (1), SWEEP_TIMEOUT (100 s cold; the warm and batched passes get
# WARM_TIMEOUT, 45 s), TESTS (the pytest selection below), TEST_TIMEOUT (170 s), MODEL (config:llama-3.2-1b;
# config:llama-3.1-8b takes ≈ 6 min to build its random weights on the host: a call of its own),
# RESTARTS (8), ROWS x COLS of the benchmark's synthetic table (10 x 5), BENCH_TIMEOUT (230 s), TOKENIZER, WHEELS.
# A dry run on a CPU: DEADLINE_S=1800 SWEEP_MODEL=config:tiny-llama SWEEP_N=2 SWEEP_BATCH=2 MODEL=config:tiny-llama RESTARTS=2 \
#   TESTS=tests/test_generate.py experiments/device_check.sh /tmp/device_dry

set -uo pipefail
OUT_DIR=${1:-${OUT:-device_check}}
PYTHON=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-570}
SWEEP_MODEL=${SWEEP_MODEL:-config:smollm2-135m}
SWEEP_N=${SWEEP_N:-12}
SWEEP_BATCH=${SWEEP_BATCH:-1}
SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-100}
WARM_TIMEOUT=${WARM_TIMEOUT:-45}
TESTS=${TESTS:-tests/test_modeling.py tests/test_attack.py tests/test_generate.py tests/test_sharding.py}
TEST_TIMEOUT=${TEST_TIMEOUT:-170}
MODEL=${MODEL:-config:llama-3.2-1b}
RESTARTS=${RESTARTS:-8}
ROWS=${ROWS:-10}
COLS=${COLS:-5}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-230}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
START=$SECONDS

if [ -n "${WHEELS:-}" ]; then  # packages the machine lacks, carried as wheels
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/atp_site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/atp_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout's atp_jax, whatever else is installed
if [ -n "${TOKENIZER:-}" ]; then
    export ATP_JAX_TEST_TOKENIZER=$TOKENIZER
fi

# Runs one step under the smaller of its cap ($2 s) and what is left of the deadline; a failure or a cut
# marks the script's exit status (through a file: steps run inside pipelines) and the next step still runs.
FAILED=$(mktemp)
step() {
    local name=$1 cap=$2 left=$((DEADLINE_S - (SECONDS - START))) t0=$SECONDS rc=0
    shift 2
    ((left < cap)) && cap=$left
    if ((cap <= 5)); then
        echo "== $name: not started, the deadline has come"
        echo "$name: not started" >>"$FAILED"
        return
    fi
    echo "== $name (at most $cap s)"
    timeout "$cap" "$@" || rc=$?
    echo "== $name: $((SECONDS - t0)) s, exit $rc$([ "$rc" = 124 ] && echo ' (cut at its limit)')"
    [ "$rc" = 0 ] || echo "$name: exit $rc" >>"$FAILED"
}

"$PYTHON" - <<'PY' 2>&1 | tee "$OUT_DIR/devices.txt"
import importlib.metadata as md
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), jax.devices())
for d in jax.local_devices():
    print(d, (d.memory_stats() or {}).get("bytes_limit"))
for name in ("jaxlib", "flax", "optax", "numpy", "scipy", "transformers", "tokenizers", "torch", "gguf"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "missing")
PY

# 1. The paper's table without generation: cold, on the warm cache, batched (see the header).
export JAX_COMPILATION_CACHE_DIR=$(mktemp -d)  # fresh, so "cold" is cold; JAX's variable wins over the project's
SWEEP=("$PYTHON" experiments/run_attack.py --model "$SWEEP_MODEL" --dtype bfloat16 ${TOKENIZER:+--tokenizer "$TOKENIZER"}
    --dataset sample --num_examples "$SWEEP_N" --max_rows 12 --max_cols 8 --attacks paper_table --nogenerate)
{
    step "sweep, cold" "$SWEEP_TIMEOUT" "${SWEEP[@]}" --output_dir "$OUT_DIR/sweep/cold"
    step "sweep, warm cache" "$WARM_TIMEOUT" "${SWEEP[@]}" --output_dir "$OUT_DIR/sweep/warm"
    if ((SWEEP_BATCH > 1)); then
        step "sweep, $SWEEP_BATCH questions at once" "$WARM_TIMEOUT" "${SWEEP[@]}" --output_dir "$OUT_DIR/sweep/batched" \
            --batch_examples "$SWEEP_BATCH"
    fi
} 2>&1 | tee "$OUT_DIR/sweep.log"
tar -czf "$OUT_DIR/sweep.tgz" -C "$OUT_DIR" sweep && rm -r "$OUT_DIR/sweep"

# 2. The tests a GPU can change, at true float32; the forced-CPU-device ones (test_sharding's subprocesses) and
#    the real-checkpoint ones stay on the CPU machines. Verbose, so a run cut at its limit still names each result.
# shellcheck disable=SC2086  # TESTS is a list of paths
step tests "$TEST_TIMEOUT" env JAX_DEFAULT_MATMUL_PRECISION=highest "$PYTHON" -m pytest -v --maxfail=5 \
    -p no:cacheprovider -m "not slow and not forced_devices" $TESTS 2>&1 | tee "$OUT_DIR/tests.log"

# 3. One ATP step of RESTARTS restarts and one whole attack (atp_st, one step of RESTARTS restarts: set-up, the
#    step, the true losses of the orders found) on the random-weight MODEL, 5 timed runs after one warm-up.
step benchmark "$BENCH_TIMEOUT" "$PYTHON" experiments/benchmark.py \
    --model "$MODEL" --dtype bfloat16 \
    --variants atp_step,attack_example \
    --restarts "$RESTARTS" --attack_preset "atp_st@n_attack=1,restarts=$RESTARTS" \
    --rows "$ROWS" --cols "$COLS" --repeats 5 --new_tokens 8 \
    ${TOKENIZER:+--tokenizer "$TOKENIZER"} \
    --json_out "$OUT_DIR/bench.json" 2>&1 | tee "$OUT_DIR/bench.log"

if [ -s "$OUT_DIR/bench.json" ]; then
    "$PYTHON" - "$OUT_DIR/bench.json" "$RESTARTS" <<'PY' || echo "benchmark summary: failed" >>"$FAILED"
import json, sys
figures, restarts = json.load(open(sys.argv[1])), sys.argv[2]
print(f"{figures['model']} ({figures['dtype']}, {figures['attack_prompt_tokens']}-token prompt, {figures['devices']})")
print(f"one ATP step of {restarts} restarts: {figures[f'atp_step_r{restarts}_median_s']:.3f} s")
print(f"seconds per example (whole attack, one step of {restarts} restarts): {figures['attack_example_median_s']:.3f}")
peak = figures.get("device_peak_bytes_in_use_gb_max")
print(f"weights {figures['weights_gb']:.2f} GB; device peak {peak} GB" if peak else f"weights {figures['weights_gb']:.2f} GB")
PY
fi
echo "total $((SECONDS - START)) s"
if [ -s "$FAILED" ]; then
    echo "steps that failed or were cut:"
    cat "$FAILED"
    exit 1
fi
