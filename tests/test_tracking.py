"""Experiment tracking: what ``--tensorboard_dir`` writes, read back by TensorBoard's own reader
(``event_accumulator``), equals the records; a run that is one process of several tags its log lines and leaves
the progress bar and the tables to process 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import tensorboard_scalars

from atp_jax.runs.records import AttackRecord, SkipRecord
from atp_jax.runs.tracking import TensorBoardSink, trace_series

pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
pytest.importorskip("tensorboardX")

REPO = Path(__file__).resolve().parents[1]


def _record(attack: str, example_id: str, loss: float, trace: dict, scores: dict | None = None) -> AttackRecord:
    return AttackRecord(
        id=example_id,
        attack=attack,
        row_perm=[0, 2, 1],
        col_perm=[1, 0],
        answer_loss=loss,
        clean_loss=1.25,
        queries=7,
        backward_calls=3,
        seconds=0.5,
        scores=scores or {},
        trace=trace,
    )


def test_trace_series_flattens_each_shape_of_trace():
    trace = {
        "losses": [1.0, 2.5],  # best_of_k: one number per query
        "loss": [[3.0, 2.0], [1.0, 0.5]],  # ATP: one list per restart
        "steps": [{"gain": 0.5, "swap": [1, 2]}, {"gain": -1.0, "swap": [0, 1]}],  # search: one dict per step
        "distinct_orders_visited": 8,  # a number: a scalar, not a series
        "note": "text",
    }
    assert trace_series(trace) == {
        "losses": [1.0, 2.5],
        "loss/restart_0": [3.0, 2.0],
        "loss/restart_1": [1.0, 0.5],
        "steps/gain": [0.5, -1.0],
    }


def test_tensorboard_sink_writes_what_tensorboard_reads_back(tmp_path):
    """Process 1 of 2: its run is ``process_1``, and the K-th example of its shard is step 1 + 2K."""
    sink = TensorBoardSink(tmp_path / "tb", process_index=1, process_count=2)
    first = _record("atp_st", "nt-1", 2.0625, {"loss": [[3.0, 2.0]], "distinct_orders_visited": 4}, {"accuracy": 1.0})
    second = _record("atp_st", "nt/7", 0.1, {"loss": [[0.2]]}, {"accuracy": 0.0, "judge": None})
    sink.write(first, 0, "atp_st")
    sink.write(SkipRecord("nt-5", "atp_st", "prompt too long"), 1, "atp_st")
    sink.write(second, 2, "atp_st")
    sink.close()

    scalars = tensorboard_scalars(tmp_path / "tb" / "process_1")
    assert scalars["atp_st/answer_loss"] == [(1, 2.0625), (5, np.float32(0.1))]
    assert scalars["atp_st/score/accuracy"] == [(1, 1.0), (5, 0.0)]
    assert scalars["atp_st/trace/distinct_orders_visited"] == [(1, 4.0)]
    for field, value in (("clean_loss", 1.25), ("queries", 7), ("backward_calls", 3), ("seconds", 0.5)):
        assert scalars[f"atp_st/{field}"] == [(1, value), (5, value)]
    assert "atp_st/score/judge" not in scalars  # a null score is no number
    assert tensorboard_scalars(tmp_path / "tb" / "traces" / "nt-1") == {"atp_st/loss/restart_0": [(0, 3.0), (1, 2.0)]}
    assert tensorboard_scalars(tmp_path / "tb" / "traces" / "nt_7") == {"atp_st/loss/restart_0": [(0, np.float32(0.2))]}


def test_a_run_writes_its_records_to_tensorboard_and_tags_its_logs(tmp_path):
    """SmolLM2-135M on two sample questions, run as process 1 of 2 (so it attacks the second): the event files
    hold each record's numbers and trace; its log lines carry the process tag; no progress bar and no table."""
    out, tb = tmp_path / "run", tmp_path / "tb"
    command = [
        sys.executable,
        "-m",
        "atp_jax.cli.run_attack",
        "--model",
        "smollm2-135m-instruct",
        "--num_examples",
        "2",
        "--attacks",
        "vanilla,best_of_k@k=3",
        "--nogenerate",
        "--distributed",
        "off",
        "--process_index",
        "1",
        "--process_count",
        "2",
        "--output_dir",
        out,
        "--tensorboard_dir",
        tb,
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        list(map(str, command)), cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]

    records = [json.loads(line) for line in (out / "results.shard1.jsonl").read_text().splitlines()]
    assert [r["attack"] for r in records] == ["vanilla", "best_of_k@k=3"]
    scalars = tensorboard_scalars(tb / "process_1")
    for record, tag in zip(records, ["vanilla", "best_of_k_k_3"]):  # TensorBoard writes "_" for "@" and "="
        for field in ("answer_loss", "clean_loss", "queries", "backward_calls", "seconds"):
            assert scalars[f"{tag}/{field}"] == [(1, np.float32(record[field]))], field
    best = records[1]
    traces = tensorboard_scalars(tb / "traces" / best["id"])
    assert traces["best_of_k_k_3/losses"] == [(i, np.float32(v)) for i, v in enumerate(best["trace"]["losses"])]

    assert done.stdout.startswith("[process 1/2] 1 examples x 2 attacks: 0 recorded, 2 to run"), done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("|")], done.stdout  # no table
    assert "attacking" not in done.stderr  # no progress bar
    logged = [line for line in done.stderr.splitlines() if "TensorBoard event files in" in line]
    assert logged and logged[0].startswith("[process 1/2] I"), done.stderr[-3000:]
