"""TAT-QA as its repository (NExTplusplus/TAT-QA) ships it: ``dataset_raw/tatqa_dataset_<split>.json``.

Each item holds one table (``uid``, rows of strings), its paragraphs and its questions. Only the questions
answered from the table alone (``answer_from == "table"``) are read by default; the paragraphs, in their
``order``, go to ``Example.paragraphs`` (shown in a prompt under ``PromptStyle(paragraphs=True)``).

TAT-QA tables have multi-row headers, merged here into one header row:

* Cells are stripped; rows that are then entirely empty are dropped (``meta.dropped_empty_rows``).
* Row 0 is a header row, and so is each next row that has a label outside column 0 and no numeric value
  there; a year such as 2019 is a label, not a value. A row with only its first cell filled labels a
  section of the body, and ends the header.
* Per header row, a single label outside column 0 spans every column but the first; when the labels start in
  column 1, an empty cell takes the label on its left where a lower header row has a label below it (a
  spanning group heading). The header is each column's labels joined by spaces, top to bottom.

The header rows as given are in ``meta.header_rows_raw`` (when there are several), their count in
``meta.n_header_rows``. Answers: the list items, or the single number or string, as text; a number keeps the
digits the JSON file writes (``meta.answer_raw_kind`` says which: list, int, float, str).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from atp_jax.data.releases import Release, order_keyword_flag
from atp_jax.tables.table import Example, Table

SPLIT_FILES = {
    "dev": "dataset_raw/tatqa_dataset_dev.json",
    "train": "dataset_raw/tatqa_dataset_train.json",
    "test": "dataset_raw/tatqa_dataset_test_gold.json",
}
TABLE_ONLY = ("table",)

_YEAR = re.compile(r"(19|20)\d\d")
# A number as financial tables write it: sign or parentheses, a currency symbol, digits with thousands commas,
# decimals, a percent sign.
_VALUE = re.compile(r"[\(\-–—]?\s*[\$€£¥]?\s*[\(\-–—]?\s*(\d[\d,]*(\.\d+)?|\.\d+)\s*%?\s*\)?")


class _JsonFloat(str):
    """A JSON number with a fraction or exponent, as the file writes it (``str(float)`` could change it)."""


def _is_value(cell: str) -> bool:
    return bool(_VALUE.fullmatch(cell)) and not _YEAR.fullmatch(cell)


def _is_header_row(row: Sequence[str]) -> bool:
    rest = row[1:]
    return any(rest) and not any(_is_value(cell) for cell in rest)


def merge_header_rows(rows: Sequence[Sequence[str]]) -> list[str]:
    """One header from stripped header rows (the module docstring's rules)."""
    width = len(rows[0])
    parts: list[list[str]] = [[] for _ in range(width)]
    for k, row in enumerate(rows):
        labelled = [j for j in range(1, width) if row[j]]
        filled = list(row)
        if len(labelled) == 1:
            filled = [row[0]] + [row[labelled[0]]] * (width - 1)
        elif labelled and labelled[0] == 1:
            for j in range(2, width):
                if not filled[j] and any(lower[j] for lower in rows[k + 1 :]):
                    filled[j] = filled[j - 1]
        for j, label in enumerate(filled):
            if label:
                parts[j].append(label)
    return [" ".join(labels) for labels in parts]


def _answers(answer) -> tuple[list[str], str]:
    """The answer as strings, and its kind in the JSON (list, int, float or str)."""
    if isinstance(answer, list):
        return [str(item) for item in answer], "list"
    if isinstance(answer, _JsonFloat):
        return [str(answer)], "float"
    if isinstance(answer, int) and not isinstance(answer, bool):
        return [str(answer)], "int"
    return [str(answer)], "str"


def read(checkout: Path, split: str, answer_from: Sequence[str] = TABLE_ONLY) -> list[Example]:
    """The questions of ``split`` whose ``answer_from`` is in ``answer_from``, table by table in file order.
    ``meta``: ``table_uid``, ``answer_type``, ``scale``, ``answer_raw_kind``, ``derivation``, ``req_comparison``,
    ``source_file``, ``n_header_rows``, ``header_rows_raw`` (several header rows), ``dropped_empty_rows`` (when
    some were), ``order_kw``."""
    source = SPLIT_FILES[split]
    with (checkout / source).open(encoding="utf-8") as handle:
        items = json.load(handle, parse_float=_JsonFloat)
    examples = []
    for item in items:
        raw_rows = [row for row in item["table"]["table"] if any(cell.strip() for cell in row)]
        rows = [[cell.strip() for cell in row] for row in raw_rows]
        dropped = len(item["table"]["table"]) - len(rows)
        n_header = 1
        while n_header < len(rows) and _is_header_row(rows[n_header]):
            n_header += 1
        header = merge_header_rows(rows[:n_header]) if n_header > 1 else rows[0]
        table = Table(header, rows[n_header:])
        paragraphs = [p["text"] for p in sorted(item.get("paragraphs", []), key=lambda p: int(p["order"]))]
        for question in item["questions"]:
            if question["answer_from"] not in answer_from:
                continue
            answers, kind = _answers(question["answer"])
            text = question["question"].strip()
            meta = {
                "table_uid": item["table"]["uid"],
                "answer_type": question["answer_type"],
                "scale": question["scale"],
                "answer_raw_kind": kind,
                "derivation": question["derivation"],
                "req_comparison": question["req_comparison"],
                "source_file": source,
                "n_header_rows": n_header,
            }
            if n_header > 1:
                meta["header_rows_raw"] = [list(row) for row in raw_rows[:n_header]]
            if dropped:
                meta["dropped_empty_rows"] = dropped
            meta["order_kw"] = order_keyword_flag(text)
            examples.append(Example(text, table, answers, question["uid"], meta, "tatqa", paragraphs))
    return examples


RELEASE = Release("NExTplusplus/TAT-QA", "TAT-QA", SPLIT_FILES, read)
