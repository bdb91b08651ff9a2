"""The official-release readers (atp_jax/data/releases) against the JSONL converted from the same files.

The repositories' own dev files are in ``official/`` beside the converted ``<name>/dev.jsonl`` in the shared
data folder (``$ATP_JAX_DATA``, else ``shared/data`` inside or next to the checkout); tests that need them are
skipped where it is absent. Every example must match its converted record: id, dataset, question, answers,
cells and ``meta`` (keys in the same order).
"""

import json
import shutil

import pytest
from conftest import find_shared_data, run_binary

import atp_jax
from atp_jax.data.datasets import DatasetUnavailableError, example_to_dict, load_dataset, locate_dataset
from atp_jax.data.releases import wtq
from atp_jax.inference.qa import answer_loss
from atp_jax.runs.fingerprints import dataset_fingerprint
from atp_jax.runs.records import read_records
from atp_jax.tables.prompt import PromptStyle

DATA_DIR = find_shared_data()
OFFICIAL = DATA_DIR / "official" if DATA_DIR else None
needs_official = pytest.mark.skipif(
    OFFICIAL is None or not OFFICIAL.is_dir(), reason="the official dev files are not in the shared data"
)
FOLDERS = {"wtq": "WikiTableQuestions", "tatqa": "TAT-QA", "fetaqa": "FeTaQA"}


def _converted(name):
    with open(DATA_DIR / name / "dev.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@needs_official
@pytest.mark.parametrize("name", ["wtq", "tatqa", "fetaqa"])
def test_release_reproduces_every_converted_dev_record(name):
    read = [example_to_dict(example) for example in load_dataset(name, data_dir=OFFICIAL)]
    converted = _converted(name)
    assert [r["id"] for r in read] == [r["id"] for r in converted]
    # The shared copy of the WTQ repository lacks misc/table-metadata.tsv, the source of page_title:
    # the reader leaves the key out rather than invent it (the test below gives it the file).
    without_title = name == "wtq" and not (OFFICIAL / FOLDERS[name] / wtq.METADATA_FILE).is_file()
    for mine, theirs in zip(read, converted):
        paragraphs = mine.pop("paragraphs", None)
        assert (paragraphs is not None) == (name == "tatqa")
        if without_title:
            assert "page_title" not in mine["meta"]
            theirs["meta"].pop("page_title")
        assert mine == theirs, mine["id"]
        assert list(mine["meta"]) == list(theirs["meta"]), mine["id"]


@needs_official
def test_a_checkout_is_found_as_the_data_dir_itself_or_inside_it():
    inside = locate_dataset("fetaqa", data_dir=OFFICIAL)
    itself = locate_dataset("fetaqa", data_dir=OFFICIAL / "FeTaQA")
    assert inside.path == itself.path == OFFICIAL / "FeTaQA"
    # Converted JSONL wins where a folder has both layouts.
    assert locate_dataset("fetaqa", data_dir=DATA_DIR).release is None


@needs_official
def test_tatqa_paragraphs_come_in_their_order():
    with open(OFFICIAL / "TAT-QA" / "dataset_raw" / "tatqa_dataset_dev.json", encoding="utf-8") as handle:
        items = json.load(handle)
    by_table = {item["table"]["uid"]: item["paragraphs"] for item in items}
    for example in load_dataset("tatqa", data_dir=OFFICIAL):
        paragraphs = by_table[example.meta["table_uid"]]
        assert len(example.paragraphs) == len(paragraphs) > 0
        for paragraph in paragraphs:
            assert example.paragraphs[paragraph["order"] - 1] == paragraph["text"]


def _small_wtq_checkout(tmp_path, lines=4):
    """The first ``lines`` - 1 dev questions of the official WTQ copy, with the tables they name."""
    source = OFFICIAL / "WikiTableQuestions"
    rows = (source / wtq.SPLIT_FILES["dev"]).read_text(encoding="utf-8").split("\n")[:lines]
    checkout = tmp_path / "WikiTableQuestions"
    (checkout / "data").mkdir(parents=True)
    (checkout / wtq.SPLIT_FILES["dev"]).write_text("\n".join(rows) + "\n", encoding="utf-8")
    for row in rows[1:]:
        table = row.split("\t")[2]
        (checkout / table).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / table, checkout / table)
    return checkout, [row.split("\t") for row in rows[1:]]


@needs_official
def test_wtq_page_titles_and_canonical_targets_are_read_when_the_checkout_has_them(tmp_path):
    checkout, rows = _small_wtq_checkout(tmp_path)
    titles = {r["meta"]["table_id"]: r["meta"]["page_title"] for r in _converted("wtq")[: len(rows)]}
    (checkout / "misc").mkdir()
    (checkout / wtq.METADATA_FILE).write_text(
        "id\tbatchId\tcontextId\turl\ttitle\n"
        + "".join(f"{k}\t0\t{table}\thttp://x\t{title}\n" for k, (table, title) in enumerate(titles.items())),
        encoding="utf-8",
    )
    # The tagged files' targetCanon: one canonical value per answer, '|'-joined with the TSV escapes.
    (checkout / "tagged" / "data").mkdir(parents=True)
    (checkout / wtq.TAGGED_FILES[0]).write_text(
        "id\tutterance\tcontext\ttargetValue\ttargetCanon\n"
        f"{rows[0][0]}\tq\tc\tv\t12467.0\n{rows[1][0]}\tq\tc\tv\ta\\pb|1972-11-11\n",
        encoding="utf-8",
    )
    examples = load_dataset("wtq", data_dir=tmp_path)
    converted = _converted("wtq")[: len(rows)]
    for example, record in zip(examples, converted):
        assert {k: v for k, v in example.meta.items() if k != "target_canon"} == record["meta"]
    assert examples[0].meta["target_canon"] == ["12467.0"]
    assert examples[1].meta["target_canon"] == ["a|b", "1972-11-11"]
    assert list(examples[1].meta)[-1] == "target_canon"  # appended last, as in the converted records
    assert "target_canon" not in examples[2].meta


@needs_official
def test_release_fingerprint_hashes_the_tables_too(tmp_path):
    checkout, rows = _small_wtq_checkout(tmp_path)
    before = dataset_fingerprint("wtq", data_dir=checkout)["dataset_sha256"]
    table = checkout / rows[0][2]
    table.write_text(table.read_text(encoding="utf-8").replace("Wolfe Tones", "Wolfe Tone"), encoding="utf-8")
    assert dataset_fingerprint("wtq", data_dir=checkout)["dataset_sha256"] != before
    table.unlink()
    with pytest.raises(ValueError, match=f"{table.name} is missing"):
        dataset_fingerprint("wtq", data_dir=checkout)
    with pytest.raises(FileNotFoundError, match="complete checkout"):
        load_dataset("wtq", data_dir=checkout)


def test_missing_data_names_both_layouts(tmp_path):
    with pytest.raises(DatasetUnavailableError, match=r"wtq/dev\.jsonl not found .*of ppasupat/WikiTableQuestions"):
        load_dataset("wtq", data_dir=tmp_path)
    with pytest.raises(DatasetUnavailableError, match="has no split 'validation'"):
        load_dataset("tatqa", split="validation", data_dir=tmp_path)


@needs_official
def test_run_attack_reads_a_release_and_shows_tatqa_paragraphs(tiny_checkpoint, tmp_path):
    out = tmp_path / "run"
    args = ["--model", tiny_checkpoint, "--dataset", "tatqa", "--data_dir", OFFICIAL, "--num_examples", 1]
    args += ["--attacks", "vanilla", "--nogenerate", "--paragraphs", "--output_dir", out]
    done = run_binary("run_attack", args)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["style"]["paragraphs"] is True
    assert manifest["dataset_sha256"] == dataset_fingerprint("tatqa", data_dir=OFFICIAL)["dataset_sha256"]
    (record,) = read_records(out / "results.jsonl")
    example = next(e for e in load_dataset("tatqa", data_dir=OFFICIAL) if e.id == record["id"])
    model = atp_jax.load_model(tiny_checkpoint)
    with_text = answer_loss(model, example, style=PromptStyle(paragraphs=True))
    assert record["answer_loss"] == pytest.approx(with_text, rel=1e-5)
    assert with_text != pytest.approx(answer_loss(model, example), rel=1e-5)  # the paragraphs reached the model
