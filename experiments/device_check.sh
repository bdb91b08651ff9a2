#!/bin/bash
# What an accelerator changes, checked in one go (under 10 minutes on one H200): the tests whose numbers a GPU
# can move (the decoder against transformers, the attack's exactness), then the speed of an 8B-shaped model in
# bfloat16: one ATP step of 8 restarts, and one whole attack of that size, in seconds per example.
#
#   experiments/device_check.sh [OUT_DIR]          # from the repository root; figures land in OUT_DIR
#
# Needs the project installed with its test extra (pip install -e '.[cuda12,dev]') or, on a machine with JAX,
# flax, transformers and torch already there, gguf added (carried as a wheel: set WHEELS=DIR). The tests use
# SmolLM2's tokenizer from the zoo; a machine that can fetch nothing takes a saved copy instead, made where the
# zoo is at hand and carried along:
#   python -c "from atp_jax.models import gguf, zoo; gguf.load_gguf_tokenizer(zoo.resolve('smollm2-135m-instruct')).save_pretrained('tok')"
#   TOKENIZER=tok experiments/device_check.sh
#
# Numerics: on recent NVIDIA GPUs JAX's default float32 matmul is TF32 (a 10-bit mantissa, about 1e-3 relative),
# which the tests' tolerances (1e-4 against PyTorch's float32, 1e-5 between meshes) do not allow; they run with
# JAX_DEFAULT_MATMUL_PRECISION=highest (true float32 products). The benchmark runs with the default precision, as
# a real run does (its model is bfloat16 anyway).
#
# Environment: PYTHON (python3), MODEL (config:llama-3.1-8b), RESTARTS (8), ROWS x COLS of the synthetic table
# (10 x 5), TESTS (the pytest selection below), TEST_TIMEOUT (330 s), BENCH_TIMEOUT (240 s), TOKENIZER, WHEELS.
# A dry run on a CPU: MODEL=config:tiny-llama RESTARTS=2 TESTS=tests/test_generate.py experiments/device_check.sh

set -uo pipefail
OUT_DIR=${1:-${OUT:-device_check}}
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-config:llama-3.1-8b}
RESTARTS=${RESTARTS:-8}
ROWS=${ROWS:-10}
COLS=${COLS:-5}
TESTS=${TESTS:-tests/test_modeling.py tests/test_attack.py tests/test_generate.py tests/test_sharding.py}
TEST_TIMEOUT=${TEST_TIMEOUT:-330}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT_DIR"

if [ -n "${WHEELS:-}" ]; then  # packages the machine lacks, carried as wheels
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/atp_site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/atp_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout's atp_jax, whatever else is installed
if [ -n "${TOKENIZER:-}" ]; then
    export ATP_JAX_TEST_TOKENIZER=$TOKENIZER
fi

"$PYTHON" - <<'PY' 2>&1 | tee "$OUT_DIR/devices.txt"
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), jax.devices())
for d in jax.local_devices():
    print(d, (d.memory_stats() or {}).get("bytes_limit"))
PY

# 1. The tests a GPU can change, at true float32; the forced-CPU-device ones (test_sharding's subprocesses) and
#    the real-checkpoint ones stay on the CPU machines.
status=0
JAX_DEFAULT_MATMUL_PRECISION=highest timeout "$TEST_TIMEOUT" "$PYTHON" -m pytest -q -x -p no:cacheprovider \
    -m "not slow and not forced_devices" $TESTS 2>&1 | tee "$OUT_DIR/tests.log" || status=1

# 2. One ATP step of RESTARTS restarts and one whole attack (atp_st, one step of RESTARTS restarts: set-up, the
#    step, the true losses of the orders found) on the 8B-shaped random model, 5 timed runs after one warm-up.
timeout "$BENCH_TIMEOUT" "$PYTHON" experiments/benchmark.py \
    --model "$MODEL" --dtype bfloat16 \
    --variants atp_step,attack_example \
    --restarts "$RESTARTS" --attack_preset "atp_st@n_attack=1,restarts=$RESTARTS" \
    --rows "$ROWS" --cols "$COLS" --repeats 5 --new_tokens 8 \
    ${TOKENIZER:+--tokenizer "$TOKENIZER"} \
    --json_out "$OUT_DIR/bench.json" 2>&1 | tee "$OUT_DIR/bench.log" || status=1

"$PYTHON" - "$OUT_DIR/bench.json" "$RESTARTS" <<'PY' || status=1
import json, sys
figures, restarts = json.load(open(sys.argv[1])), sys.argv[2]
print(f"{figures['model']} ({figures['dtype']}, {figures['attack_prompt_tokens']}-token prompt, {figures['devices']})")
print(f"one ATP step of {restarts} restarts: {figures[f'atp_step_r{restarts}_median_s']:.3f} s")
print(f"seconds per example (whole attack, one step of {restarts} restarts): {figures['attack_example_median_s']:.3f}")
peak = figures.get("device_peak_bytes_in_use_gb_max")
print(f"weights {figures['weights_gb']:.2f} GB; device peak {peak} GB" if peak else f"weights {figures['weights_gb']:.2f} GB")
PY
exit "$status"
