"""Which cells of a table carry a question's evidence, read from the gold answer and the question's words.

Structured attacks move this evidence (to the front, the middle or the end of the table; the answer's column
first or last). The reading is a heuristic on the text alone, as FREB-TQA's structured perturbations use it:

- an *answer cell* is a data cell whose text, normalised as the official WTQ evaluator normalises answers,
  equals one of the gold answers';
- a *key cell* is a data cell whose normalised text (three characters or more, so that "1" or "no" do not
  match everywhere) occurs as whole words in the normalised question — the entity the question selects on.

Aggregate questions ("how many ...") often have neither; ``Evidence.found`` is then False.
"""

from __future__ import annotations

import dataclasses
import re

from atp_jax.tables.normalize import normalize_wtq
from atp_jax.tables.table import Example

MIN_KEY_CHARS = 3


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Cells as ``(data_row, column)`` pairs, sorted; data rows count from 0 below the header."""

    answer_cells: tuple[tuple[int, int], ...]
    key_cells: tuple[tuple[int, int], ...]

    @property
    def rows(self) -> tuple[int, ...]:
        """Data rows holding an answer or a key cell, in table order."""
        return tuple(sorted({r for r, _ in self.answer_cells + self.key_cells}))

    @property
    def answer_columns(self) -> tuple[int, ...]:
        """Columns holding an answer cell, in table order."""
        return tuple(sorted({c for _, c in self.answer_cells}))

    @property
    def found(self) -> bool:
        return bool(self.answer_cells or self.key_cells)


def _words(text: str) -> str:
    # Space-padded so that a cell matches whole words of the question only ("rome" not in "romeo").
    return " " + " ".join(re.findall(r"\w+", text)) + " "


def find_evidence(example: Example) -> Evidence:
    """The answer and key cells of ``example`` (see the module's docstring for the rules)."""
    answers = {normalize_wtq(a) for a in example.answers} - {""}
    question = _words(normalize_wtq(example.question))
    answer_cells, key_cells = [], []
    for r, row in enumerate(example.table.rows):
        for c, cell in enumerate(row):
            text = normalize_wtq(cell)
            if text in answers:
                answer_cells.append((r, c))
            elif len(text) >= MIN_KEY_CHARS and _words(text).strip() and _words(text) in question:
                key_cells.append((r, c))
    return Evidence(tuple(answer_cells), tuple(key_cells))
