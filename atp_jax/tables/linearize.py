"""Render a :class:`Table` as prompt text, keeping track of where every cell lands.

Every style produces a sequence of :class:`Segment` pieces: fixed *template* text
(separators, tags, brackets) and *cell* pieces that hold one cell's rendered text. The
prompt text is their concatenation, and each cell's character span follows from the
segment lengths. The token layout of the attack works on this segmentation: a
permutation moves cell pieces between slots while template pieces stay where they are.

Position independence
---------------------
In every style a cell's rendered text depends only on the cell's own string (and, for
``csv``, on the table width, which no permutation changes), never on where the cell
sits. Rendering ``table.permute(rp, cp)`` therefore gives the same template pieces in
the same places, with slot ``(a, b)`` holding the rendered text of cell
``(rp[a-1] + 1, cp[b])`` of the original (row 0, the header, is pinned).

Styles
------
``markdown`` (default)
    A GitHub-style pipe table::

        | Team | Wins |
        | --- | --- |
        | Greystones | 1 |

    ``|`` inside a cell becomes ``\\|``. A line break inside a cell (``\\r\\n``, ``\\n`` or
    ``\\r``) becomes one space, not ``<br>``: the text is read by a language model rather
    than a Markdown renderer, a space keeps the token count close to the source, and it
    matches how the shared dev files count tokens. Nothing else is escaped.
``csv``
    Comma-separated with the quoting of Python's ``csv`` module (``QUOTE_MINIMAL``):
    a field is quoted when it contains ``,``, ``"`` or a line break, and ``"`` is doubled.
    Line breaks inside quoted fields are kept; rows end with ``\\n``. As ``csv.writer``
    does, an empty cell of a *one-column* table is written ``""`` so that the row is not
    an empty line; this depends on the table's width only, so it is still permutation
    invariant.
``html``
    ``<table>`` with a ``<thead>`` header row of ``<th>`` cells and a ``<tbody>`` of
    ``<td>`` cells, one row per line. Cells are escaped with ``html.escape(quote=False)``:
    ``&``, ``<`` and ``>`` are the only characters that need escaping in element content,
    and escaping quotes would turn every apostrophe into ``&#x27;`` for no benefit.
``json``
    Rows as records: a JSON array with one object per data row, keyed by column name::

        [{"Team": "Greystones", "Wins": "1"},
         {"Team": "Ballymore Eustace", "Wins": "1"}]

    (one record per line). Keys and values are JSON strings escaped as ``json.dumps``
    does with ``ensure_ascii=False``; the cell piece is the escaped text *without* the
    surrounding quotes, which belong to the template. Two things differ from the other
    styles: (1) the header cell ``(0, j)`` is written once per record, so its cell
    piece occurs ``n_rows`` times and ``cell_spans[0][j]`` points at its occurrence in
    the first record; (2) a table with no data rows cannot be written as records and
    raises ``ValueError``. Repeated column names are written as repeated keys, which
    JSON text allows (RFC 8259 only says names SHOULD be unique); a strict JSON parser
    keeps the last one.
"""

from __future__ import annotations

import csv
import html
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from atp_jax.tables.table import Table

__all__ = ["STYLES", "Segment", "Linearized", "linearize", "render_cell"]

STYLES: tuple[str, ...] = ("markdown", "csv", "html", "json")

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Segment:
    """One piece of rendered text: fixed template text, or the rendering of one cell.

    Attributes:
        text: the characters this piece contributes to the prompt.
        cell: ``(i, j)`` for a cell piece (row 0 is the header, ``j`` the column, both in
            the coordinates of the table that was rendered), ``None`` for template text.
    """

    text: str
    cell: tuple[int, int] | None = None

    @property
    def is_cell(self) -> bool:
        """True for a cell piece, False for template text."""
        return self.cell is not None


@dataclass(frozen=True)
class Linearized:
    """A rendered table: its text, its segmentation and every cell's span.

    Attributes:
        style: the style name used.
        text: the rendered table, equal to ``"".join(s.text for s in segments)``.
        segments: template and cell pieces in order. Adjacent template pieces are merged,
            so two template pieces never touch; cell pieces are kept even when empty.
        cell_spans: ``cell_spans[i][j] == (start, end)`` with ``text[start:end]`` equal
            to the rendered text of cell ``(i, j)`` (row 0 is the header). For a cell
            that occurs several times (``json`` header keys) this is the first occurrence.
    """

    style: str
    text: str
    segments: tuple[Segment, ...]
    cell_spans: tuple[tuple[tuple[int, int], ...], ...]


def _markdown_cell(cell: str) -> str:
    return _LINE_BREAK.sub(" ", cell).replace("|", "\\|")


def _csv_cell(cell: str, n_cols: int) -> str:
    if cell == "" and n_cols > 1:
        # csv.writer writes a lone empty field as '""' only when it is the whole row.
        return ""
    buffer = io.StringIO()
    csv.writer(buffer, quoting=csv.QUOTE_MINIMAL, lineterminator="\n").writerow([cell])
    return buffer.getvalue()[: -len("\n")]


def _html_cell(cell: str) -> str:
    return html.escape(cell, quote=False)


def _json_cell(cell: str) -> str:
    # json.dumps gives a quoted JSON string; the quotes are template text.
    return json.dumps(cell, ensure_ascii=False)[1:-1]


def render_cell(cell: str, style: str = "markdown", n_cols: int = 2) -> str:
    """The text that ``cell`` contributes to a table rendered in ``style``.

    Args:
        cell: the cell's raw string.
        style: one of :data:`STYLES`.
        n_cols: the table's width; only ``csv`` uses it (an empty cell of a one-column
            table is written ``""``).
    """
    _check_style(style)
    if style == "markdown":
        return _markdown_cell(cell)
    if style == "csv":
        return _csv_cell(cell, n_cols)
    if style == "html":
        return _html_cell(cell)
    return _json_cell(cell)


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}")


def _markdown_pieces(table: Table) -> Iterator[tuple[str, tuple[int, int] | None]]:
    for i, row in enumerate(table.cells):
        if i > 0:
            yield "\n", None
        yield "| ", None
        for j, cell in enumerate(row):
            if j > 0:
                yield " | ", None
            yield _markdown_cell(cell), (i, j)
        yield " |", None
        if i == 0:
            # The delimiter row follows the header even for a header-only table.
            yield "\n|" + " --- |" * table.n_cols, None


def _csv_pieces(table: Table) -> Iterator[tuple[str, tuple[int, int] | None]]:
    for i, row in enumerate(table.cells):
        if i > 0:
            yield "\n", None
        for j, cell in enumerate(row):
            if j > 0:
                yield ",", None
            yield _csv_cell(cell, table.n_cols), (i, j)


def _html_pieces(table: Table) -> Iterator[tuple[str, tuple[int, int] | None]]:
    yield "<table>\n<thead>\n<tr>", None
    for j, cell in enumerate(table.header):
        yield "<th>", None
        yield _html_cell(cell), (0, j)
        yield "</th>", None
    yield "</tr>\n</thead>\n<tbody>", None
    for i, row in enumerate(table.rows, start=1):
        yield "\n<tr>", None
        for j, cell in enumerate(row):
            yield "<td>", None
            yield _html_cell(cell), (i, j)
            yield "</td>", None
        yield "</tr>", None
    yield "\n</tbody>\n</table>", None


def _json_pieces(table: Table) -> Iterator[tuple[str, tuple[int, int] | None]]:
    if table.n_rows == 0:
        raise ValueError(
            "the json (rows-as-records) style needs at least one data row: a table with "
            "only a header has no records, so its column names would be lost; use "
            "another style for header-only tables"
        )
    yield "[", None
    for i, row in enumerate(table.rows, start=1):
        if i > 1:
            yield ",\n", None
        yield "{", None
        for j, cell in enumerate(row):
            if j > 0:
                yield ", ", None
            yield '"', None
            yield _json_cell(table.header[j]), (0, j)
            yield '": "', None
            yield _json_cell(cell), (i, j)
            yield '"', None
        yield "}", None
    yield "]", None


_PIECES = {
    "markdown": _markdown_pieces,
    "csv": _csv_pieces,
    "html": _html_pieces,
    "json": _json_pieces,
}


def linearize(table: Table, style: str = "markdown") -> Linearized:
    """Render ``table`` in ``style`` and return its text, segments and cell spans.

    Args:
        table: the table to render.
        style: one of :data:`STYLES` (see the module docstring for each format).

    Raises:
        ValueError: for an unknown style, or ``json`` with a table that has no data rows.
    """
    _check_style(style)
    segments: list[Segment] = []
    for text, cell in _PIECES[style](table):
        if cell is not None:
            segments.append(Segment(text, cell))
        elif text:
            if segments and not segments[-1].is_cell:
                # Merge touching template pieces so the segmentation is canonical.
                segments[-1] = Segment(segments[-1].text + text)
            else:
                segments.append(Segment(text))

    spans: list[list[tuple[int, int] | None]] = [[None] * table.n_cols for _ in range(table.n_rows + 1)]
    offset = 0
    for segment in segments:
        end = offset + len(segment.text)
        if segment.cell is not None:
            i, j = segment.cell
            if spans[i][j] is None:
                spans[i][j] = (offset, end)
        offset = end
    missing = [(i, j) for i, row in enumerate(spans) for j, span in enumerate(row) if span is None]
    if missing:  # Guards the renderers above: every cell must be written at least once.
        raise AssertionError(f"style {style!r} did not render cells {missing}")

    return Linearized(
        style=style,
        text="".join(segment.text for segment in segments),
        segments=tuple(segments),
        cell_spans=tuple(tuple(row) for row in spans),  # type: ignore[arg-type]
    )
