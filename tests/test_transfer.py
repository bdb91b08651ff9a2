"""atp_jax/cli/transfer.py end to end: the orders a run recorded, replayed under another prompt style, give the
losses the answerer computes for those orders directly; a resume replays nothing; a resume under another
style or target model is refused."""

import json

import numpy as np
from conftest import run_binary

import atp_jax
from atp_jax.inference.qa import answer_losses
from atp_jax.runs.experiment import select_examples
from atp_jax.runs.records import read_records
from atp_jax.tables.prompt import PromptStyle

SELECTION = ["--num_examples", "2", "--max_rows", "7", "--max_cols", "5"]


def test_transfer_replays_recorded_orders(tiny_checkpoint, tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    attacks = ["--attacks", "vanilla,row_reverse,random", "--nogenerate"]
    done = run_binary("run_attack", ["--model", tiny_checkpoint, *SELECTION, *attacks, "--output_dir", source])
    assert done.returncode == 0, done.stderr[-3000:]
    replay = ["--results", source, "--style", "csv", "--output_dir", target]
    done = run_binary("transfer", replay)
    assert done.returncode == 0, done.stderr[-3000:]

    sources = {(r["id"], r["attack"]): r for r in read_records(source / "results.jsonl")}
    replayed = list(read_records(target / "results.jsonl"))
    assert {(r["id"], r["attack"]) for r in replayed} == set(sources)
    manifest = json.loads((target / "run.json").read_text())
    assert manifest["style"]["linearization"] == "csv" and manifest["transferred_from"]["results"] == str(source)

    model = atp_jax.load_model(tiny_checkpoint)
    examples = {e.id: e for e in select_examples("sample", num_examples=2, max_rows=7, max_cols=5)}
    for record in replayed:
        example = examples[record["id"]]
        table = example.table.permute(record["row_perm"], record["col_perm"])
        (expected,) = answer_losses(model, example, [table], PromptStyle(linearization="csv"))
        np.testing.assert_allclose(record["answer_loss"], expected, atol=1e-5)
        assert record["transferred_from"]["answer_loss"] == sources[(record["id"], record["attack"])]["answer_loss"]

    again = run_binary("transfer", replay)
    assert again.returncode == 0 and "0 orders to replay (6 recorded)" in again.stdout, again.stdout[-2000:]
    other = run_binary("transfer", ["--results", source, "--style", "html", "--output_dir", target])
    assert other.returncode != 0 and "style" in other.stderr and "--restart" in other.stderr, other.stderr[-2000:]
