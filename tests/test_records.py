"""Result records: atomic appends, torn-line handling, and the records the experiment library writes."""

import json

import numpy as np
import pytest

from atp_jax import jsonl
from atp_jax.attack.presets import preset
from atp_jax.inference.qa import answer_losses
from atp_jax.runs.experiment import replay, run_one
from atp_jax.runs.manifest import ResultsFolder
from atp_jax.runs.records import AttackRecord, append_record, done_keys, read_records
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example, Table


def test_round_trip_one_sorted_line_per_record(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, {"id": "a", "attack": "vanilla", "answer_loss": 1.5})
    append_record(path, {"id": "b", "attack": "paper", "prediction": "Zoë"})
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines == [
        '{"answer_loss": 1.5, "attack": "vanilla", "id": "a"}',
        '{"attack": "paper", "id": "b", "prediction": "Zoë"}',
    ]
    assert list(read_records(path)) == [
        {"id": "a", "attack": "vanilla", "answer_loss": 1.5},
        {"id": "b", "attack": "paper", "prediction": "Zoë"},
    ]


def test_missing_file_reads_as_empty(tmp_path):
    assert list(read_records(tmp_path / "nope.jsonl")) == []
    assert done_keys([tmp_path / "nope.jsonl"]) == set()


def test_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, {"id": "a", "attack": "vanilla"})
    with path.open("a") as f:
        f.write('{"id": "b", "attack": "pa')  # killed mid-write
    assert [r["id"] for r in read_records(path)] == ["a"]
    assert done_keys([path]) == {("a", "vanilla")}


def test_append_after_torn_line_cuts_the_fragment(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, {"id": "a", "attack": "vanilla"})
    with path.open("a") as f:
        f.write('{"id": "b", "attack": "pa')
    append_record(path, {"id": "b", "attack": "paper"})  # the resumed run's first record
    assert path.read_text() == '{"attack": "vanilla", "id": "a"}\n{"attack": "paper", "id": "b"}\n'


def test_append_cuts_a_fragment_longer_than_one_read_block(tmp_path):
    path = tmp_path / "results.jsonl"
    append_record(path, {"id": "a", "attack": "vanilla"})
    with path.open("a") as f:
        f.write('{"trace": "' + "x" * (3 * jsonl._TAIL_BLOCK + 17))
    append_record(path, {"id": "b", "attack": "paper"})
    assert [r["id"] for r in read_records(path)] == ["a", "b"]
    assert path.stat().st_size == len('{"attack": "vanilla", "id": "a"}\n{"attack": "paper", "id": "b"}\n')


def test_append_to_a_file_holding_only_a_fragment(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "a", "att')
    append_record(path, {"id": "b", "attack": "paper"})
    assert path.read_text() == '{"attack": "paper", "id": "b"}\n'


def test_damaged_complete_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "a", "attack": "vanilla"}\nnot json\n{"id": "b", "attack": "paper"}\n')
    with pytest.raises(ValueError, match=r"results\.jsonl:2 is not a JSON record"):
        list(read_records(path))
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"results\.jsonl:1 holds a JSON list"):
        list(read_records(path))


def test_done_keys_spans_files(tmp_path):
    append_record(tmp_path / "results.shard0.jsonl", {"id": "a", "attack": "vanilla"})
    append_record(tmp_path / "results.shard1.jsonl", {"id": "b", "attack": "paper", "skipped": "too small"})
    assert done_keys([tmp_path / "results.shard0.jsonl", tmp_path / "results.shard1.jsonl"]) == {
        ("a", "vanilla"),
        ("b", "paper"),
    }


def test_result_and_manifest_paths_per_process(tmp_path):
    assert ResultsFolder(tmp_path).results_file == tmp_path / "results.jsonl"
    assert ResultsFolder(tmp_path, 3, 4).results_file == tmp_path / "results.shard3.jsonl"
    assert ResultsFolder(tmp_path).manifest_file == tmp_path / "run.json"
    assert ResultsFolder(tmp_path, 2, 4).manifest_file == tmp_path / "run.shard2.json"


def test_a_folder_lists_every_shard_in_process_order(tmp_path):
    for name in ("results.shard10.jsonl", "results.shard2.jsonl", "results.jsonl", "results.shardx.jsonl", "run.json"):
        (tmp_path / name).write_text("")
    names = [p.name for p in ResultsFolder.record_files(tmp_path)]
    assert names == ["results.jsonl", "results.shard2.jsonl", "results.shard10.jsonl"]
    assert [p.name for p in ResultsFolder.manifest_files(tmp_path)] == ["run.json"]


# --------------------------------------------------------------------------- records of one attack, replayed

EXAMPLE = Example(
    "Which team was first?",
    Table(["Team", "City", "Wins"], [["Lions", "Paris", "3"], ["Bears", "Rome", "12"], ["Owls", "Oslo", "7"]]),
    ["Lions"],
    "toy",
    dataset="wtq",
)
SCHEMA = {
    "id",
    "attack",
    "row_perm",
    "col_perm",
    "prediction",
    "scores",
    "answer_loss",
    "clean_loss",
    "queries",
    "backward_calls",
    "seconds",
    "generate_seconds",
    "trace",
}


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama()


def test_run_one_record_and_its_replay_match_the_rerendered_loss(tiny, tmp_path):
    style = PromptStyle()
    typed = run_one(tiny, EXAMPLE, "row_reverse", preset("row_reverse"), style, max_new_tokens=4)
    assert isinstance(typed, AttackRecord)
    record = typed.as_dict()
    assert set(record) == SCHEMA
    assert record["row_perm"] == [2, 1, 0] and record["col_perm"] == [0, 1, 2]
    assert set(record["scores"]) == {"accuracy"} and isinstance(record["prediction"], str)
    expected = answer_losses(tiny, EXAMPLE, [EXAMPLE.table, EXAMPLE.table.permute([2, 1, 0])], style)
    assert record["clean_loss"] == pytest.approx(expected[0], abs=1e-4)
    assert record["answer_loss"] == pytest.approx(expected[1], abs=1e-4)

    # Replayed in another prompt style, the loss is that style's re-rendered loss of the same order.
    csv_style = PromptStyle(linearization="csv")
    origin = {"results": "src", "model": "tiny", "style": {"linearization": "markdown"}}
    skipped = {"id": "toy", "attack": "atp_col", "skipped": "one column"}
    replayed, still_skipped = (r.as_dict() for r in replay(tiny, EXAMPLE, [record, skipped], csv_style, source=origin))
    want = answer_losses(tiny, EXAMPLE, [EXAMPLE.table, EXAMPLE.table.permute([2, 1, 0])], csv_style)
    assert replayed["answer_loss"] == pytest.approx(want[1], abs=1e-4)
    assert replayed["clean_loss"] == pytest.approx(want[0], abs=1e-4)
    assert not np.isclose(want[1], expected[1])  # the style does change the measurement
    assert replayed["prediction"] is None and replayed["scores"] == {}
    assert replayed["transferred_from"] == {**origin, "answer_loss": record["answer_loss"]}
    assert set(replayed) == SCHEMA | {"transferred_from"}
    assert still_skipped == {**skipped, "transferred_from": origin}

    path = tmp_path / "results.jsonl"
    append_record(path, replayed)
    assert json.loads(path.read_text()) == replayed


def test_pending_skips_what_each_folder_recorded(tmp_path):
    from atp_jax.runs.loop import Job, pending

    a, b = ResultsFolder(tmp_path / "a"), ResultsFolder(tmp_path / "b")
    for folder in (a, b):
        folder.path.mkdir()
    a.append({"id": "toy", "attack": "vanilla", "answer_loss": 1.0})
    b.append({"id": "toy", "attack": "paper", "skipped": "too long"})
    jobs = [
        Job(a, "vanilla", preset("vanilla")),
        Job(b, "vanilla", preset("vanilla")),
        Job(b, "paper", preset("paper")),
    ]
    other = Example("q?", Table(["h"], [["x"], ["y"]]), ("x",), id="other")
    todo = pending([EXAMPLE, other], jobs)
    assert [(ex.id, job.folder.path.name, job.name) for ex, job in todo] == [
        ("toy", "b", "vanilla"),
        ("other", "a", "vanilla"),
        ("other", "b", "vanilla"),
        ("other", "b", "paper"),
    ]
