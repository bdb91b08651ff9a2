"""Tests for atp_jax.data.datasets and the bundled sample.

The shared dev files are looked up in ``$ATP_JAX_DATA``, then in ``shared/data`` inside
or next to the checkout; tests that need them are skipped when none is found.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import find_shared_data

from atp_jax.data import datasets as ds
from atp_jax.data.datasets import (
    DatasetUnavailableError,
    filter_examples,
    is_order_sensitive,
    load_dataset,
    load_hf_dataset,
    load_jsonl,
)
from atp_jax.data.make_sample import SampleRule, select_sample
from atp_jax.data.order_filter import is_order_dependent
from atp_jax.tables.linearize import linearize
from atp_jax.tables.table import Example, Table

REPO = Path(__file__).resolve().parents[1]
SAMPLE_FILE = REPO / "atp_jax" / "data" / "wtq_sample.jsonl"


DATA_DIR = find_shared_data()
needs_data = pytest.mark.skipif(DATA_DIR is None, reason="shared dev files not found (set ATP_JAX_DATA)")


def _record(**overrides):
    record = {
        "id": "x-1",
        "dataset": "wtq",
        "question": "which team won first?",
        "answers": ["A"],
        "table": {"header": ["Team", "Year"], "rows": [["A", "2001"], ["B", "2002"]]},
        "meta": {"table_id": "t"},
    }
    record.update(overrides)
    return record


def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------ shared dev files


@needs_data
@pytest.mark.parametrize("name, count", [("wtq", 2831), ("tatqa", 772), ("fetaqa", 1001)])
def test_load_shared_dev_files(name, count):
    examples = load_dataset(name, data_dir=DATA_DIR)
    with open(DATA_DIR / name / "dev.jsonl", encoding="utf-8") as handle:
        assert len(examples) == sum(1 for _ in handle) == count
    assert all(example.dataset == name for example in examples)
    assert all(len(row) == ex.table.n_cols for ex in examples for row in ex.table.rows)


@needs_data
def test_first_wtq_example_is_read_exactly():
    first = load_jsonl(DATA_DIR / "wtq" / "dev.jsonl")[0]
    assert first.id == "nt-2"
    assert first.question == "which team won previous to crettyard?"
    assert first.answers == ("Wolfe Tones",)
    assert first.table.header == ("Team", "County", "Wins", "Years won")
    assert first.table.n_rows == 9
    assert first.table.rows[7] == ("Wolfe Tones", "Meath", "1", "2004")
    assert first.meta["table_id"] == "csv/204-csv/772.csv"


@needs_data
def test_data_dir_from_environment(monkeypatch):
    monkeypatch.setenv("ATP_JAX_DATA", str(DATA_DIR))
    assert len(load_dataset("tatqa")) == 772
    tatqa = load_dataset("tatqa")[0]
    assert tatqa.meta["scale"] in ("", "thousand", "million", "billion", "percent")


# ------------------------------------------------------------------ bundled sample


def test_bundled_sample_loads_and_follows_the_rule():
    sample = load_dataset("sample")
    assert 150 <= len(sample) <= 200
    assert len({example.id for example in sample}) == len(sample)
    assert all(example.dataset == "wtq" for example in sample)
    for example in sample:
        table = example.table
        assert 4 <= table.n_rows <= 12 and 2 <= table.n_cols <= 6
        assert not any("\n" in cell for row in table.cells for cell in row)
        assert len(linearize(table).text.split()) <= 250
        assert example.answers
    # Order-free questions fill it; a few order-dependent ones stay for the order filter to drop.
    n_dependent = sum(map(is_order_dependent, sample))
    assert n_dependent == SampleRule().order_dependent and 0 < n_dependent <= len(sample) // 10


def test_sample_license_is_shipped_next_to_the_sample():
    text = (REPO / "atp_jax" / "data" / "SAMPLE_LICENSE.md").read_text(encoding="utf-8")
    assert "CC BY-SA 4.0" in text and "Pasupat" in text


@needs_data
def test_sample_is_reproducible_and_verbatim():
    source = (DATA_DIR / "wtq" / "dev.jsonl").read_text(encoding="utf-8").splitlines()
    bundled = SAMPLE_FILE.read_text(encoding="utf-8").splitlines()
    assert select_sample(source) == bundled
    assert set(bundled) <= set(source)


def test_sample_only_has_dev_split():
    with pytest.raises(ValueError, match="only the 'dev' split"):
        load_dataset("sample", split="test")


# ------------------------------------------------------------------ JSONL errors


def test_load_jsonl_reads_a_small_file_and_skips_blank_lines(tmp_path):
    path = _write_lines(tmp_path / "a.jsonl", [json.dumps(_record()), "", json.dumps(_record(id="x-2"))])
    examples = load_jsonl(path)
    assert [e.id for e in examples] == ["x-1", "x-2"]
    assert examples[0].table == Table(["Team", "Year"], [["A", "2001"], ["B", "2002"]])
    assert examples[0].meta == {"table_id": "t"}
    assert load_dataset(str(path)) == examples  # a .jsonl path works as a name


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such JSONL file"):
        load_jsonl(tmp_path / "missing.jsonl")


def test_bad_json_names_the_line(tmp_path):
    path = _write_lines(tmp_path / "bad.jsonl", [json.dumps(_record()), "{not json"])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: invalid JSON"):
        load_jsonl(path)


def test_missing_key_names_line_and_key(tmp_path):
    record = _record()
    del record["answers"]
    path = _write_lines(
        tmp_path / "k.jsonl", [json.dumps(_record(id="x-2")), json.dumps(_record(id="x-3")), json.dumps(record)]
    )
    with pytest.raises(ValueError, match=r"k\.jsonl:3: missing key 'answers'"):
        load_jsonl(path)


def test_ragged_table_in_file_names_line_and_row(tmp_path):
    record = _record(table={"header": ["a", "b"], "rows": [["1", "2"], ["3"]]})
    path = _write_lines(tmp_path / "r.jsonl", [json.dumps(record)])
    with pytest.raises(ValueError, match=r"r\.jsonl:1: row 1 has 1 cells but the header has 2"):
        load_jsonl(path)


def test_malformed_fields(tmp_path):
    cases = [
        (_record(answers="A"), "'answers' must be a list"),
        (_record(table={"header": ["a"]}), "'table' must be an object with keys 'header' and 'rows'"),
        (_record(meta=[1]), "'meta' must be an object"),
        ([1, 2], "expected a JSON object"),
    ]
    for record, message in cases:
        path = _write_lines(tmp_path / "m.jsonl", [json.dumps(record)])
        with pytest.raises(ValueError, match=message):
            load_jsonl(path)


def test_a_record_without_dataset_is_refused_unless_the_caller_names_it(tmp_path):
    record = _record(id="x-2")
    del record["dataset"]
    path = _write_lines(tmp_path / "d.jsonl", [json.dumps(_record()), json.dumps(record)])
    with pytest.raises(ValueError, match=r"d\.jsonl:2: no 'dataset' field.*add \"dataset\".*dataset=") as error:
        load_jsonl(path)
    assert "load_dataset(path, dataset=...)" in str(error.value)
    with pytest.raises(ValueError, match=r"d\.jsonl:2: no 'dataset' field"):
        load_dataset(str(path))
    # Named, the dataset fills the missing field; a record naming the same one is kept as it is.
    assert [e.dataset for e in load_jsonl(path, dataset="wtq")] == ["wtq", "wtq"]
    assert [e.dataset for e in load_dataset(path, dataset="wtq")] == ["wtq", "wtq"]
    _write_lines(path, [json.dumps(record), json.dumps(_record(dataset=""))])  # ids x-2 and x-1
    assert [e.dataset for e in load_jsonl(path, dataset="tatqa")] == ["tatqa", "tatqa"]


def test_a_record_contradicting_the_named_dataset_is_refused(tmp_path):
    path = _write_lines(tmp_path / "c.jsonl", [json.dumps(_record(dataset="wtq"))])
    with pytest.raises(ValueError, match=r"c\.jsonl:1: 'dataset' is 'wtq' but the file is loaded as 'tatqa'"):
        load_jsonl(path, dataset="tatqa")
    _write_lines(path, [json.dumps(_record(dataset="squad"))])
    with pytest.raises(ValueError, match=r"c\.jsonl:1: 'dataset' is 'squad': use one of wtq, tatqa, fetaqa"):
        load_jsonl(path)
    with pytest.raises(ValueError, match=r"dataset='squad': use one of"):
        load_jsonl(path, dataset="squad")
    with pytest.raises(ValueError, match=r"the 'sample' data is 'wtq'"):
        load_dataset("sample", dataset="tatqa")


def test_a_named_dataset_fills_its_own_name(tmp_path):
    record = _record()
    del record["dataset"]
    (tmp_path / "tatqa").mkdir()
    _write_lines(tmp_path / "tatqa" / "dev.jsonl", [json.dumps(record)])
    assert [e.dataset for e in load_dataset("tatqa", data_dir=tmp_path)] == ["tatqa"]
    assert [e.dataset for e in load_dataset("tatqa", data_dir=tmp_path, dataset="tatqa")] == ["tatqa"]
    with pytest.raises(ValueError, match=r"the 'tatqa' data is 'tatqa'; drop dataset="):
        load_dataset("tatqa", data_dir=tmp_path, dataset="wtq")


def test_load_dataset_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("ATP_JAX_DATA", raising=False)
    with pytest.raises(ValueError, match="unknown dataset 'squad'"):
        load_dataset("squad")
    with pytest.raises(DatasetUnavailableError, match="ATP_JAX_DATA"):
        load_dataset("wtq")
    expected = tmp_path / "fetaqa" / "dev.jsonl"
    with pytest.raises(DatasetUnavailableError, match=str(expected)):
        load_dataset("fetaqa", data_dir=tmp_path)


# ------------------------------------------------------------------ hub loading


@pytest.mark.parametrize(
    "call",
    ['load_hf_dataset("Stanford/wikitablequestions", "validation")', 'load_dataset("hf:Stanford/wikitablequestions")'],
)
def test_hf_offline_fails_fast_with_a_clear_message(tmp_path, call):
    # Run in a fresh interpreter: the hub libraries read HF_HUB_OFFLINE at import time.
    code = textwrap.dedent(
        f"""
        import time
        from atp_jax.data.datasets import DatasetUnavailableError, load_dataset, load_hf_dataset
        start = time.monotonic()
        try:
            {call}
        except DatasetUnavailableError as error:
            print("ERROR:", error)
        print("SECONDS:", time.monotonic() - start)
        """
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert "ERROR:" in result.stdout and "offline mode is on" in result.stdout
    assert "'Stanford/wikitablequestions' (split 'validation')" in result.stdout  # dev is the hub's validation
    assert "HF_HUB_OFFLINE" in result.stdout
    call_seconds = float(result.stdout.split("SECONDS:")[1])
    assert call_seconds < 10, result.stdout
    assert elapsed < 60


def test_hf_unreachable_endpoint_fails_fast(monkeypatch):
    import socket

    for var in ds._OFFLINE_VARS + ds._PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as probe:  # A port that was free a moment ago: nothing listens.
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(DatasetUnavailableError, match="cannot reach the Hugging Face Hub"):
        load_hf_dataset("some/dataset", "validation", connect_timeout=2.0)
    with pytest.raises(DatasetUnavailableError, match="'some/dataset': cannot reach the Hugging Face Hub"):
        load_dataset("hf:some/dataset")
    assert time.monotonic() - start < 10


def test_hf_records_are_converted(monkeypatch):
    datasets = pytest.importorskip("datasets")
    records = [
        {"id": "nt-0", "question": "q0?", "answers": ["a"], "table": {"header": ["h"], "rows": [["a"]], "name": "t"}},
        {"feta_id": 7, "question": "q1?", "answer": "long answer", "table_array": [["h1", "h2"], ["x", "y"]]},
    ]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # No network probe.
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: records)
    examples = load_hf_dataset("some/dataset", "validation", dataset="wtq")
    assert examples[0] == Example("q0?", Table(["h"], [["a"]]), ("a",), "nt-0", {}, "wtq")
    assert examples[1].id == "7" and examples[1].answers == ("long answer",)
    assert examples[1].table == Table(["h1", "h2"], [["x", "y"]])

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [{"question": "q", "label": 1}])
    with pytest.raises(ValueError, match=r"record 0 .* keys are \['label', 'question'\]; pass converter"):
        load_hf_dataset("other/dataset", "train")


# ------------------------------------------------------------------ order sensitivity and filters


@pytest.mark.parametrize(
    "question, sensitive",
    [
        ("which team won previous to crettyard?", True),
        ("Who came FIRST?", True),  # case-insensitive
        ("what is listed above the total?", True),
        ("what is the total?", False),
        ("which topic was firstly discussed?", False),  # whole words only
        ("what is the top speed?", False),  # attribute, excluded
        ("What was the change in Income before Income Taxes from 2018 to 2019?", False),
        ("What is the profit after tax in 2019?", False),
        ("What was the change in Earnings before interest and taxes EBIT?", False),
        ("which train is listed first with a top speed over 300?", True),  # another keyword remains
        ("what is the first name on the list?", True),  # 'first name' is not excluded
    ],
)
def test_is_order_sensitive(question, sensitive):
    assert is_order_sensitive(question) is sensitive


def _example(question, n_rows, n_cols, cell="x"):
    header = [f"h{j}" for j in range(n_cols)]
    return Example(question, Table(header, [[cell] * n_cols for _ in range(n_rows)]), ["a"], question)


def test_filter_examples():
    examples = [
        _example("who was first?", 3, 2),
        _example("how many?", 10, 2),
        _example("what came next?", 3, 8),
        _example("total?", 2, 2, cell="y" * 50),
    ]
    ids = lambda kept: [e.id for e in kept]  # noqa: E731
    keywords = {"order_filter": "keywords"}  # the paper's rule; the default classifier is tested below
    assert ids(filter_examples(examples)) == ids(examples)
    assert ids(filter_examples(examples, order_sensitive=True, **keywords)) == ["who was first?", "what came next?"]
    assert ids(filter_examples(examples, order_sensitive=False, **keywords)) == ["how many?", "total?"]
    assert ids(filter_examples(examples, max_rows=3)) == ["who was first?", "what came next?", "total?"]
    assert ids(filter_examples(examples, max_cols=2)) == ["who was first?", "how many?", "total?"]
    assert ids(filter_examples(examples, max_cell_chars=10)) == ["who was first?", "how many?", "what came next?"]
    assert ids(filter_examples(examples, order_sensitive=True, max_cols=2, **keywords)) == ["who was first?"]
    # The classifier reads the table too: these tables have no order, and only "listed last" refers to it.
    listed = [*examples, _example("which one is listed last?", 3, 2)]
    assert ids(filter_examples(listed, order_sensitive=True)) == ["which one is listed last?"]
    assert ids(filter_examples(listed, order_sensitive=False, max_cols=2)) == ["who was first?", "how many?", "total?"]
    with pytest.raises(ValueError, match="max_rows must be a non-negative int"):
        filter_examples(examples, max_rows=-1)


def test_duplicate_ids_are_refused_with_both_line_numbers(tmp_path):
    path = _write_lines(
        tmp_path / "dup.jsonl", [json.dumps(_record(id="a")), json.dumps(_record(id="b")), json.dumps(_record(id="a"))]
    )
    with pytest.raises(ValueError, match=r"dup\.jsonl:3: duplicate id 'a' \(first at line 1\)"):
        load_jsonl(path)


def test_missing_cells_in_a_file_are_empty_cells(tmp_path):
    record = _record(table={"header": ["Team", "Year"], "rows": [["A", None], ["B", float("nan")]]})
    path = _write_lines(tmp_path / "nan.jsonl", [json.dumps(record)])  # json writes NaN; Python reads it back
    (example,) = load_jsonl(path)
    assert example.table.rows == (("A", ""), ("B", ""))


def test_select_examples_by_id_keeps_the_datasets_order_and_names_what_is_missing():
    from atp_jax.runs.experiment import select_examples

    everything = select_examples("sample", drop_order_sensitive=False)
    order_free = {e.id for e in select_examples("sample")}
    first, second = [e.id for e in everything if e.id in order_free][2:4]
    picked = select_examples("sample", ids=[second, first])
    assert [e.id for e in picked] == [first, second]
    assert [e.id for e in select_examples("sample", ids=[second, first], num_examples=1)] == [first]
    with pytest.raises(ValueError, match="nt-nowhere are not in the dev split"):
        select_examples("sample", ids=[first, "nt-nowhere"])
    dependent = next(e.id for e in everything if e.id not in order_free)
    with pytest.raises(ValueError, match=f"{dependent} are dropped by the filters"):
        select_examples("sample", ids=[dependent])
    assert [e.id for e in select_examples("sample", drop_order_sensitive=False, ids=[dependent])] == [dependent]
