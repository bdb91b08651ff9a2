"""WikiTableQuestions as its repository (ppasupat/WikiTableQuestions) ships it.

A split is a TSV of questions (``id``, ``utterance``, ``context`` — the table's CSV path — and ``targetValue``,
several answers joined by ``|``, with the repository's TSV escapes ``\\n``, ``\\p`` for ``|`` and ``\\\\``).
Tables are read from ``csv/2xx-csv/N.csv`` with the repository's CSV dialect (quotes escaped as ``\\"``); the
header is the CSV's first row (multi-row headers were already merged there with line breaks) and every cell is
stripped of surrounding whitespace. When the checkout has them, ``misc/table-metadata.tsv`` gives
``meta.page_title`` and the CoreNLP-tagged files (``tagged/data/*.tagged``) the canonical gold values
``meta.target_canon`` that the official evaluator compares against.
"""

from __future__ import annotations

from pathlib import Path

from atp_jax.data.releases import Release, order_keyword_flag
from atp_jax.tables.table import Example, Table

SPLIT_FILES = {
    "dev": "data/random-split-1-dev.tsv",
    "train": "data/random-split-1-train.tsv",
    "test": "data/pristine-unseen-tables.tsv",
}
METADATA_FILE = "misc/table-metadata.tsv"
TAGGED_FILES = ("tagged/data/training.tagged", "tagged/data/pristine-unseen-tables.tagged")


def tsv_unescape(text: str) -> str:
    """Undoes the repository's TSV escapes (the official evaluator's ``tsv_unescape``)."""
    return text.replace(r"\n", "\n").replace(r"\p", "|").replace("\\\\", "\\")


def tsv_unescape_list(text: str) -> list[str]:
    """A ``|``-joined TSV field as its items (the official evaluator's ``tsv_unescape_list``)."""
    return [tsv_unescape(item) for item in text.split("|")]


def _tsv_rows(path: Path) -> list[dict[str, str]]:
    """A repository TSV as dicts by its header; the fields keep their escapes (no quoting: tabs split)."""
    with path.open(encoding="utf-8", newline="") as handle:
        lines = handle.read().split("\n")
    header = lines[0].split("\t")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise ValueError(f"{path}:{number}: {len(fields)} tab-separated fields, the header has {len(header)}")
        rows.append(dict(zip(header, fields)))
    return rows


def _read_table(path: Path) -> Table:
    """One table's CSV."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the questions name it; use a complete checkout of the repository")
    return Table.from_csv(path, escapechar="\\", doublequote=False)


def _page_titles(checkout: Path) -> dict[str, str]:
    path = checkout / METADATA_FILE
    if not path.is_file():
        return {}
    return {row["contextId"]: row["title"] for row in _tsv_rows(path)}


def _canonical_targets(checkout: Path) -> dict[str, list[str]]:
    canon = {}
    for name in TAGGED_FILES:
        if (checkout / name).is_file():
            canon.update({row["id"]: tsv_unescape_list(row["targetCanon"]) for row in _tsv_rows(checkout / name)})
    return canon


def read(checkout: Path, split: str) -> list[Example]:
    """The questions of ``split`` in file order. ``meta``: ``table_id`` (the CSV path), ``page_title`` (with the
    metadata file), ``source_file``, ``n_header_rows`` (1), ``order_kw``, and ``target_canon`` (with the tagged
    files; one canonical value per answer)."""
    source = SPLIT_FILES[split]
    titles, canon = _page_titles(checkout), _canonical_targets(checkout)
    tables: dict[str, Table] = {}  # several questions share a table
    examples = []
    for row in _tsv_rows(checkout / source):
        question = tsv_unescape(row["utterance"])
        if row["context"] not in tables:
            tables[row["context"]] = _read_table(checkout / row["context"])
        meta = {"table_id": row["context"]}
        if row["context"] in titles:
            meta["page_title"] = titles[row["context"]]
        meta.update(source_file=source, n_header_rows=1, order_kw=order_keyword_flag(question))
        if row["id"] in canon:
            meta["target_canon"] = canon[row["id"]]
        examples.append(
            Example(
                question=question,
                table=tables[row["context"]],
                answers=tsv_unescape_list(row["targetValue"]),
                id=row["id"],
                meta=meta,
                dataset="wtq",
            )
        )
    return examples


def extra_files(checkout: Path, split: str) -> list[str]:
    """Every table the split's TSV names, and the metadata and tagged files when present."""
    tables = sorted({row["context"] for row in _tsv_rows(checkout / SPLIT_FILES[split])})
    return [*tables, *(name for name in (METADATA_FILE, *TAGGED_FILES) if (checkout / name).is_file())]


RELEASE = Release("ppasupat/WikiTableQuestions", "WikiTableQuestions", SPLIT_FILES, read, extra_files)
