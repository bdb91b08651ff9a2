"""Bad input never ends a run or loses an example: each is a recorded skip with its reason, with the
good examples around it recorded, or — for what no run can start from — one clear message before the
model loads."""

import json
from pathlib import Path

import pytest
from conftest import run_binary

from atp_jax.inference.qa import InputTooLong, answer, answer_loss
from atp_jax.runs.records import read_records
from atp_jax.tables.table import Example, Table

REPO = Path(__file__).resolve().parents[1]


def _record(id_, header, rows, answers=("A",)):
    return {
        "id": id_,
        "dataset": "wtq",
        "question": "which one?",
        "answers": list(answers),
        "table": {"header": header, "rows": rows},
    }


def _write(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _run(args, timeout=600):
    return run_binary("run_attack", args, timeout)


GOOD = [["A", "1"], ["B", "2"], ["C", "3"]]


def test_examples_the_attack_cannot_take_are_recorded_skips_between_recorded_good_ones(tiny_checkpoint, tmp_path):
    long_rows = [[f"entry number {i} of a long list", f"{i * 7919}", f"note {i}"] for i in range(150)]
    data = _write(
        tmp_path / "bad.jsonl",
        [
            _record("good-1", ["Name", "Value"], GOOD),
            _record("header-only", ["Name", "Value"], []),
            _record("huge-cell", ["Name", "Value"], [["A", " ".join(f"w{i}" for i in range(500))], ["B", "2"]]),
            _record("over-context", ["Name", "Number", "Note"], long_rows),
            _record("good-2", ["Name", "Value"], GOOD[::-1]),
        ],
    )
    out = tmp_path / "run"
    done = _run(
        [
            "--model",
            str(tiny_checkpoint),
            "--dataset",
            str(data),
            "--num_examples",
            "0",
            "--max_rows",
            "1000",
            "--max_cols",
            "100",
            "--nofilter_order_sensitive",
            "--nogenerate",
            "--attacks",
            "vanilla,best_of_k@k=2",
            "--memory_budget_gb",
            "0.1",
            "--output_dir",
            str(out),
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = {(r["id"], r["attack"]): r for r in read_records(out / "results.jsonl")}
    assert len(records) == 10  # every (example, attack) pair recorded once
    for good in ("good-1", "good-2"):
        assert all(records[(good, a)]["answer_loss"] > 0 for a in ("vanilla", "best_of_k@k=2"))
    reasons = {
        id_: records[(id_, "vanilla")].get("skipped", "") for id_ in ("header-only", "huge-cell", "over-context")
    }
    assert "no data rows" in reasons["header-only"]
    assert "memory budget" in reasons["huge-cell"]
    assert "over the limit" in reasons["over-context"] or "context" in reasons["over-context"]


@pytest.mark.parametrize(
    "contents, message",
    [
        (
            [_record("a", ["N", "V"], GOOD), _record("a", ["N", "V"], GOOD)],
            "data.jsonl:2: duplicate id 'a' (first at line 1)",
        ),
        ([], "no examples selected"),
    ],
)
def test_a_dataset_no_run_can_start_from_is_one_message_before_the_model_loads(tmp_path, contents, message):
    data = _write(tmp_path / "data.jsonl", contents)
    # The dataset is checked before the model loads: the message comes in seconds, no weights are read.
    done = _run(["--model", "smollm2-135m-instruct", "--dataset", str(data), "--output_dir", str(tmp_path / "o")])
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_no_rows_selected_is_one_message(tmp_path):
    done = _run(["--model", "smollm2-135m-instruct", "--max_rows", "1", "--output_dir", str(tmp_path / "o")])
    assert done.returncode != 0 and "no examples selected" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["unknown name", "text file", "truncated gguf"])
def test_a_bad_model_flag_is_one_message(tmp_path, kind):
    model = {
        "unknown name": "no-such-model",
        "text file": str(tmp_path / "notes.txt"),
        "truncated gguf": str(tmp_path / "cut.gguf"),
    }[kind]
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 20)
    done = _run(["--model", model, "--num_examples", "1", "--output_dir", str(tmp_path / "o")])
    assert done.returncode != 0 and "--model" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_answering_over_the_context_is_refused_before_any_compute(tiny_llama):
    model = tiny_llama()
    limit = model.config.max_position_embeddings
    rows = [[f"row {i} " * 8, str(i)] for i in range(limit // 20)]
    example = Example("which one?", Table(["Name", "Value"], rows), ["row 1"], "long", dataset="wtq")
    with pytest.raises(InputTooLong, match="over the model's context"):
        answer(model, example, max_new_tokens=8)
    with pytest.raises(InputTooLong, match="over the model's context"):
        answer_loss(model, example)


def test_a_results_line_without_an_id_names_its_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "a", "attack": "vanilla"}\n{"attack": "vanilla"}\n')
    with pytest.raises(ValueError, match=r"results.jsonl:2 is a record without id"):
        list(read_records(path))
