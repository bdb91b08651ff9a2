"""atp_jax/cli/ablate.py end to end on a tiny random checkpoint: a numeric sweep and the options ablation, and
what it writes to TensorBoard."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import tensorboard_scalars

from atp_jax.attack.presets import attack_names, one_option_changes

REPO = Path(__file__).resolve().parents[1]


def test_ablate_records_every_point_tabulates_the_options_and_resumes(tiny_checkpoint, tmp_path):
    out = tmp_path / "ablation"
    command = [
        sys.executable,
        "-m",
        "atp_jax.cli.ablate",
        "--model",
        str(tiny_checkpoint),
        "--attack",
        "atp_st",
        "--sweeps",
        "lambda,options",
        "--lambdas",
        "0",
        "--num_examples",
        "1",
        "--nogenerate",
        "--output_dir",
        str(out),
        "--tensorboard_dir",
        str(tmp_path / "tb"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    expected = ["atp_st", *one_option_changes("atp_st")]
    records = [json.loads(line) for line in (out / "options" / "results.jsonl").read_text().splitlines()]
    assert [r["attack"] for r in records] == expected
    assert all(r["answer_loss"] > 0 and r["backward_calls"] == 20 for r in records)  # the same budget
    manifest = json.loads((out / "options" / "run.json").read_text())
    assert manifest["attacks"]["atp_st@init=uniform"]["init"] == "uniform"
    # λ = 0 is atp_st's own value: the point is the preset itself, recorded under its plain name.
    lambda_names = [json.loads(line)["attack"] for line in (out / "lambda" / "results.jsonl").read_text().splitlines()]
    assert lambda_names == ["atp_st"]
    # Every name the binary recorded is a valid --attacks entry, already in its canonical form.
    recorded = [r["attack"] for r in records] + lambda_names
    assert attack_names(recorded) == list(dict.fromkeys(recorded))
    assert manifest["selection"]["filter_order_sensitive"] and manifest["selection"]["order_filter"] == "classifier"

    table = (out / "ablation.md").read_text()
    assert "### atp_st: lambda sweep" in table and "### atp_st: one option changed at a time" in table
    for name in expected[1:]:
        assert f"| {name} | 1 |" in table and "minus_atp_st" in table
    assert (out / "ablation.png").read_bytes().startswith(b"\x89PNG")

    # atp_st is a point of both sweeps: TensorBoard shows each sweep's record under its own name.
    scalars = tensorboard_scalars(tmp_path / "tb")
    lambda_record = json.loads((out / "lambda" / "results.jsonl").read_text().splitlines()[0])
    assert scalars["lambda/atp_st/answer_loss"] == [(0, np.float32(lambda_record["answer_loss"]))]
    assert scalars["options/atp_st/answer_loss"] == [(0, np.float32(records[0]["answer_loss"]))]
    assert scalars["options/atp_st_init_uniform/backward_calls"] == [(0, 20.0)]

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    points = len(expected) + 1  # the options and the one λ
    assert f"1 examples x {points} sweep points: {points} recorded, 0 to run" in again.stdout
