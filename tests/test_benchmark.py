"""atp_jax/cli/benchmark.py end to end on a tiny random checkpoint, so that the binary cannot rot.

No time is asserted: the figures must exist and the torch copy of the model must compute the same loss
as the JAX one (an independent check of the comparison the benchmark makes).
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_binary

pytest.importorskip("torch")  # the torch variants are part of what is checked

REPO = Path(__file__).resolve().parents[1]


def test_benchmark_runs_every_variant_and_reports_the_figures(tiny_checkpoint, tmp_path):
    out = tmp_path / "bench.json"
    command = [
        sys.executable,
        "-m",
        "atp_jax.cli.benchmark",
        "--model",
        str(tiny_checkpoint),
        "--tokens",
        "32",
        "--answer_tokens",
        "4",
        "--rows",
        "3",
        "--cols",
        "2",
        "--repeats",
        "1",
        "--new_tokens",
        "4",
        "--restarts",
        "3",
        "--attack_preset",
        "atp_st",
        "--variants",
        "fwd,fwd_bwd,torch_fwd_bwd,matmul_peak,atp_steps,atp_compile,attack_example",
        "--json_out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| variant | first call (s) | median (s) | min (s) |" in done.stdout
    figures = json.loads(out.read_text())
    for name in (
        "fwd",
        "fwd_bwd",
        "torch_fwd_bwd",
        "prompt_fwd_bwd",
        "torch_prompt_fwd_bwd",
        "atp_1steps",
        "atp_r3_5steps",
        "atp_device_5steps",
        "atp_compile",
        "attack_example",
        "generate",
    ):
        assert figures[f"{name}_median_s"] > 0, name
    # The torch model holds a copy of the same weights: the same loss, on the random prompt and on the
    # attack's prompt alike.
    assert abs(figures["torch_fwd_bwd_loss_minus_jax"]) < 1e-4
    assert abs(figures["torch_prompt_fwd_bwd_loss_minus_jax"]) < 1e-4
    for key in (
        "atp_step_over_prompt_fwd_bwd",
        "atp_r3_step_over_r1",
        "device_hungarian_step_over_host",
        "torch_prompt_fwd_bwd_over_atp_step",
        "fwd_bwd_fraction_of_matmul_peak",
        "generate_tokens_per_s",
    ):
        assert math.isfinite(figures[key]), key
    assert figures["attack_table"] == "3x2" and figures["attack_prompt_tokens"] > 32
    assert figures["attack_preset"] == "atp_st"


def test_atp_compile_asked_for_with_a_preset_that_is_not_atp_is_refused_before_the_model_loads():
    done = run_binary(
        "benchmark", ["--model", "no-such-model", "--variants", "atp_compile", "--attack_preset", "vanilla"]
    )
    assert done.returncode != 0
    assert "--attack_preset vanilla: the atp_compile variant times an ATP program" in done.stdout + done.stderr


def test_training_step_variants_time_a_clean_and_an_adversarial_step(tmp_path):
    """One training step of atp_jax.train on a batch of synthetic tables, plain and with the inner attack on every
    example: both timed, their ratio, and the compiled step's memory from XLA's buffer assignment."""
    out = tmp_path / "bench.json"
    done = run_binary(
        "benchmark",
        [
            "--model",
            "config:tiny-llama",
            "--variants",
            "train_step,adversarial_train_step",
            "--rows",
            "3",
            "--cols",
            "2",
            "--train_batch",
            "2",
            "--repeats",
            "1",
            "--json_out",
            out,
        ],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    for name in ("train_step", "adversarial_train_step"):
        assert figures[f"{name}_median_s"] > 0 and figures[f"{name}_first_call_s"] > 0, name
    assert figures["adversarial_train_step_over_train_step"] > 0
    assert figures["train_step_device_peak_gb"] > 0 and figures["train_step_device_temp_gb"] >= 0
    # a full fine-tune trains every weight: the step holds at least the weights and their updated copy
    assert figures["train_trainable_gb"] == pytest.approx(figures["weights_gb"])
    assert figures["train_step_device_peak_over_weights"] > 2
    assert figures["train_attack"] == "atp_joint" and figures["train_lora_rank"] == 0
    assert figures["train_table"] == "3x2" and figures["train_batch_shape"].startswith("2x")
    assert "atp_step_median_s" not in figures  # only the variants asked for
    # the adversarial step's peak is the larger of its two programs: ATP's (a backward per restart) and the step's
    assert figures["inner_attack_device_peak_gb"] > figures["weights_gb"]
    assert figures["adversarial_train_step_device_peak_gb"] == max(
        figures["train_step_device_peak_gb"], figures["inner_attack_device_peak_gb"]
    )


def test_bad_training_flags_are_refused_before_the_model_loads():
    done = run_binary(
        "benchmark", ["--model", "no-such-model", "--variants", "train_step", "--train_attack", "atp_nothing"]
    )
    assert done.returncode != 0
    assert "--train_attack atp_nothing" in done.stdout + done.stderr
    done = run_binary("benchmark", ["--model", "no-such-model", "--variants", "train_step", "--lora_rank", "-1"])
    assert done.returncode != 0 and "--lora_rank -1" in done.stdout + done.stderr
