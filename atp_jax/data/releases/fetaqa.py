"""FeTaQA as its repository (Yale-LILY/FeTaQA) ships it: ``data/fetaQA-v1_<split>.jsonl``.

Each line holds a question, its free-form answer and ``table_array`` (row 0 the header). Cells and questions
are stripped of surrounding whitespace; the answer is kept as written. Where row 0 repeats a cell in adjacent
columns (a spanning heading) and row 1 repeats row 0's first cell, the two rows are one header split by the
page's colspans, and are merged by column: a label shared by both rows once, else both joined by a space
(``meta.header_rows_raw`` keeps them). ``meta.highlighted_cell_ids`` stays in ``table_array`` coordinates: body
row = row index − ``meta.n_header_rows``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from atp_jax.data.releases import Release, order_keyword_flag
from atp_jax.tables.table import Example, Table

SPLIT_FILES = {
    "dev": "data/fetaQA-v1_dev.jsonl",
    "train": "data/fetaQA-v1_train.jsonl",
    "test": "data/fetaQA-v1_test.jsonl",
}


def header_rows(rows: Sequence[Sequence[str]]) -> int:
    """2 when rows 0 and 1 are one header split by colspans (the module docstring's rule), else 1."""
    if len(rows) < 2:
        return 1
    first, second = rows[0], rows[1]
    spans = any(first[j] == first[j + 1] for j in range(len(first) - 1))
    return 2 if spans and second[0] == first[0] else 1


def read(checkout: Path, split: str) -> list[Example]:
    """The questions of ``split`` in file order. ``meta``: ``feta_id``, ``page_title``, ``section_title``,
    ``page_url``, ``table_source_json``, ``highlighted_cell_ids``, ``source_file``, ``n_header_rows``,
    ``header_rows_raw`` (two header rows), ``order_kw``."""
    source = SPLIT_FILES[split]
    examples = []
    with (checkout / source).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{checkout / source}:{number}: invalid JSON ({error.msg})") from None
            rows = [[cell.strip() for cell in row] for row in record["table_array"]]
            n_header = header_rows(rows)
            header = rows[0] if n_header == 1 else [a if a == b else f"{a} {b}" for a, b in zip(rows[0], rows[1])]
            question = record["question"].strip()
            meta = {
                "feta_id": record["feta_id"],
                "page_title": record["table_page_title"],
                "section_title": record["table_section_title"],
                "page_url": record["page_wikipedia_url"],
                "table_source_json": record["table_source_json"],
                "highlighted_cell_ids": record["highlighted_cell_ids"],
                "source_file": source,
                "n_header_rows": n_header,
            }
            if n_header > 1:
                meta["header_rows_raw"] = record["table_array"][:n_header]
            meta["order_kw"] = order_keyword_flag(question)
            table = Table(header, rows[n_header:])
            examples.append(Example(question, table, [record["answer"]], f"fetaqa-{record['feta_id']}", meta, "fetaqa"))
    return examples


RELEASE = Release("Yale-LILY/FeTaQA", "FeTaQA", SPLIT_FILES, read)
