"""atp_jax/cli/swap_correlation.py end to end on a tiny checkpoint: one record per example whose swap count and
best true gain agree with a brute force over every single swap scored from re-rendered text, a resume that
runs nothing, a refused resume under another model, and the comparison table over two folders."""

import itertools
import json

import numpy as np
from conftest import run_binary

import atp_jax
from atp_jax.inference.qa import answer_losses
from atp_jax.runs.experiment import select_examples

SELECTION = ["--num_examples", "2", "--max_rows", "7", "--max_cols", "5"]


def _swapped(n, a, b):
    order = list(range(n))
    order[a], order[b] = order[b], order[a]
    return order


def test_records_match_a_brute_force_and_resume(tiny_checkpoint, tmp_path):
    out = tmp_path / "tiny"
    done = run_binary("swap_correlation", ["--model", tiny_checkpoint, *SELECTION, "--output_dir", out])
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    examples = select_examples("sample", num_examples=2, max_rows=7, max_cols=5)
    assert [r["id"] for r in records] == [e.id for e in examples]

    model = atp_jax.load_model(tiny_checkpoint)
    for record, example in zip(records, examples):
        table = example.table
        tables = [
            table.permute(row_perm=_swapped(table.n_rows, a, b))
            for a, b in itertools.combinations(range(table.n_rows), 2)
        ]
        tables += [
            table.permute(col_perm=_swapped(table.n_cols, a, b))
            for a, b in itertools.combinations(range(table.n_cols), 2)
        ]
        losses = answer_losses(model, example, [table, *tables])
        gains = losses[1:] - losses[0]
        assert record["swaps"] == len(tables)
        np.testing.assert_allclose(record["best_true_gain"], gains.max(), atol=1e-4)
        np.testing.assert_allclose(record["mean_true_gain"], gains.mean(), atol=1e-4)
        assert -1 <= record["spearman"] <= 1

    again = run_binary("swap_correlation", ["--model", tiny_checkpoint, *SELECTION, "--output_dir", out])
    assert again.returncode == 0 and "2 recorded, 0 to run" in again.stdout, again.stderr[-2000:]
    other = run_binary("swap_correlation", ["--model", "smollm2-135m-instruct", *SELECTION, "--output_dir", out])
    assert other.returncode != 0 and "model" in other.stderr and "--restart" in other.stderr
    split = run_binary("swap_correlation", ["--model", tiny_checkpoint, *SELECTION, "--output_dir", out, "--decompose"])
    assert split.returncode != 0 and "--restart" in split.stderr  # records without the split are not mixed in

    one = [*SELECTION[:1], "1", *SELECTION[2:]]
    split = run_binary(
        "swap_correlation",
        [
            "--model",
            tiny_checkpoint,
            *one,
            "--output_dir",
            tmp_path / "s",
            "--decompose",
            "--soft_positions",
            "--fixed_slots",
            "--smooth_samples",
            "2",
        ],
    )
    assert split.returncode == 0, split.stderr[-3000:]
    (record,) = [json.loads(line) for line in (tmp_path / "s" / "results.jsonl").read_text().splitlines()]
    # the swaps, their content parts, their fixed-slot layouts and the fixed-slot original order
    assert record["queries"] == 3 * record["swaps"] + 1
    assert abs(record["best_true_gain"] - records[0]["best_true_gain"]) < 1e-6
    assert 0 <= record["shift_share"] <= 1 and "| **median** |" in split.stdout
    assert -1 <= record["spearman_soft_positions"] <= 1 and "soft positions" in split.stdout
    assert -1 <= record["spearman_fixed_slot_change"] <= 1 and "ρ(fixed-slot Δ, Δ)" in split.stdout
    assert -1 <= record["spearman_smoothed"] <= 1 and "smoothed" in split.stdout
    manifest = json.loads((tmp_path / "s" / "run.json").read_text())
    assert manifest["smoothed"] == {"samples": 2, "scale": 0.25, "seed": 0} and "fixed_slots" in manifest

    table = run_binary("swap_correlation", ["--compare", f"{out},{out}", "--attack_results", "-,-"])
    assert table.returncode == 0, table.stderr[-2000:]
    rows = [line for line in table.stdout.splitlines() if line.startswith(f"| {tiny_checkpoint.name} |")]
    assert len(rows) == 2 and "| 2 |" in rows[0]
