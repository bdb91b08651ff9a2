"""Tests for atp_jax.tables.linearize: formats, spans and permutation invariance."""

import csv
import io
import json
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atp_jax.tables.linearize import STYLES, Segment, linearize, render_cell
from atp_jax.tables.table import Table

TRICKY = Table(
    ["Name", "a|b", 'Say "hi"'],
    [
        ["O'Brien", "x\ny", "1,000"],
        ["<b>&amp;", "", "tab\there"],
        ["é ü", "back\\slash", "CR\r\nLF"],
    ],
)


# ------------------------------------------------------------------ hand-written renderings


def test_markdown_exact_text():
    table = Table(["Team", "Wins"], [["Greystones", "1"], ["Maynooth", "2"]])
    assert linearize(table).text == ("| Team | Wins |\n| --- | --- |\n| Greystones | 1 |\n| Maynooth | 2 |")
    assert linearize(table).style == "markdown"


def test_markdown_escapes_pipes_and_replaces_line_breaks_with_spaces():
    table = Table(["a|b"], [["x\ny"], ["p\r\nq"], ["r\rs"]])
    assert linearize(table, "markdown").text == ("| a\\|b |\n| --- |\n| x y |\n| p q |\n| r s |")


def test_markdown_header_only_keeps_the_delimiter_row():
    assert linearize(Table(["a", "b"], []), "markdown").text == "| a | b |\n| --- | --- |"


def test_html_exact_text():
    table = Table(["A&B", "C"], [["<1>", "it's"]])
    assert linearize(table, "html").text == (
        "<table>\n<thead>\n<tr><th>A&amp;B</th><th>C</th></tr>\n</thead>\n"
        "<tbody>\n<tr><td>&lt;1&gt;</td><td>it's</td></tr>\n</tbody>\n</table>"
    )


def test_json_exact_text():
    table = Table(["k", 'q"'], [["1", "a\nb"], ["2", ""]])
    assert linearize(table, "json").text == ('[{"k": "1", "q\\"": "a\\nb"},\n{"k": "2", "q\\"": ""}]')


def test_csv_exact_text():
    table = Table(["a", "b"], [["1,5", 'say "x"'], ["", "line\nbreak"]])
    assert linearize(table, "csv").text == 'a,b\n"1,5","say ""x"""\n,"line\nbreak"'


# ------------------------------------------------------------------ round trips (independent parsers)


def test_csv_matches_csv_writer_and_round_trips():
    for table in (TRICKY, Table(["only"], [[""], ["x"]])):
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(table.cells)
        text = linearize(table, "csv").text
        assert text == buffer.getvalue()[:-1]
        assert [tuple(r) for r in csv.reader(io.StringIO(text))] == list(table.cells)


class _CellCollector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def test_html_round_trips_through_an_html_parser():
    parser = _CellCollector()
    parser.feed(linearize(TRICKY, "html").text)
    assert [tuple(r) for r in parser.rows] == list(TRICKY.cells)


def test_json_round_trips_through_json_loads():
    records = json.loads(linearize(TRICKY, "json").text)
    assert records == [dict(zip(TRICKY.header, row)) for row in TRICKY.rows]


def test_json_header_only_raises():
    with pytest.raises(ValueError, match="at least one data row"):
        linearize(Table(["a"], []), "json")


def _split_markdown_row(line):
    # Reference parser: split on pipes not preceded by a backslash, then unescape.
    cells, current, k = [], "", 0
    body = line[2:-2]  # Drop the leading "| " and trailing " |".
    while k < len(body):
        if body.startswith("\\|", k):
            current += "|"
            k += 2
        elif body.startswith(" | ", k):
            cells.append(current)
            current = ""
            k += 3
        else:
            current += body[k]
            k += 1
    return tuple(cells + [current])


def test_markdown_round_trips_up_to_line_breaks():
    lines = linearize(TRICKY, "markdown").text.split("\n")
    assert len(lines) == TRICKY.n_rows + 2
    parsed = [_split_markdown_row(line) for k, line in enumerate(lines) if k != 1]
    expected = [
        tuple(c.replace("\r\n", " ").replace("\n", " ").replace("\r", " ") for c in row) for row in TRICKY.cells
    ]
    assert parsed == expected


# ------------------------------------------------------------------ segments and spans


@pytest.mark.parametrize("style", STYLES)
def test_segments_concatenate_to_text_and_spans_index_cells(style):
    out = linearize(TRICKY, style)
    assert "".join(s.text for s in out.segments) == out.text
    assert len(out.cell_spans) == TRICKY.n_rows + 1
    for i, row in enumerate(TRICKY.cells):
        assert len(out.cell_spans[i]) == TRICKY.n_cols
        for j, cell in enumerate(row):
            start, end = out.cell_spans[i][j]
            assert out.text[start:end] == render_cell(cell, style, TRICKY.n_cols)
    # No two template pieces touch: the segmentation is canonical.
    for left, right in zip(out.segments, out.segments[1:]):
        assert left.is_cell or right.is_cell
    # Data cells occur exactly once and in row-major order.
    data_cells = [s.cell for s in out.segments if s.is_cell and s.cell[0] > 0]
    assert data_cells == [(i, j) for i in range(1, TRICKY.n_rows + 1) for j in range(TRICKY.n_cols)]


def test_spans_point_at_the_unescaped_cell_text_for_plain_cells():
    table = Table(["Team", "Wins"], [["Greystones", "1"]])
    for style in STYLES:
        out = linearize(table, style)
        start, end = out.cell_spans[1][0]
        assert out.text[start:end] == "Greystones"
        start, end = out.cell_spans[0][1]
        assert out.text[start:end] == "Wins"


def test_json_header_cells_repeat_once_per_record():
    out = linearize(Table(["a", "b"], [["1", "2"], ["3", "4"], ["5", "6"]]), "json")
    header_refs = [s.cell for s in out.segments if s.is_cell and s.cell[0] == 0]
    assert header_refs == [(0, 0), (0, 1)] * 3
    start, end = out.cell_spans[0][0]
    assert out.text[start:end] == "a" and start == out.text.index('"a"') + 1


def test_unknown_style_is_rejected():
    with pytest.raises(ValueError, match="unknown style 'latex'"):
        linearize(TRICKY, "latex")
    with pytest.raises(ValueError, match="unknown style"):
        render_cell("x", "yaml")


def test_segment_kinds():
    assert Segment("| ").is_cell is False
    assert Segment("x", (1, 2)).is_cell is True


# ------------------------------------------------------------------ permutation invariance

CELL_TEXT = st.text(alphabet=st.sampled_from(list("ab |,\"'\n\r<>&\\é{}:xyz0")), max_size=5)


@st.composite
def permuted_tables(draw):
    n_rows = draw(st.integers(1, 4))
    n_cols = draw(st.integers(1, 4))
    header = draw(st.lists(CELL_TEXT, min_size=n_cols, max_size=n_cols))
    rows = draw(st.lists(st.lists(CELL_TEXT, min_size=n_cols, max_size=n_cols), min_size=n_rows, max_size=n_rows))
    row_perm = draw(st.permutations(list(range(n_rows))))
    col_perm = draw(st.permutations(list(range(n_cols))))
    return Table(header, rows), row_perm, col_perm


@settings(max_examples=150, deadline=None)
@given(permuted_tables(), st.sampled_from(STYLES))
def test_permuted_rendering_is_the_same_segments_with_cells_reordered(case, style):
    table, row_perm, col_perm = case
    original = linearize(table, style)
    permuted = linearize(table.permute(row_perm, col_perm), style)

    # Text of every original cell piece, keyed by the cell it renders.
    original_text = {}
    for segment in original.segments:
        if segment.is_cell:
            original_text.setdefault(segment.cell, segment.text)

    def source(cell):
        i, j = cell
        return (0 if i == 0 else row_perm[i - 1] + 1, col_perm[j])

    expected = [
        Segment(s.text, s.cell) if not s.is_cell else Segment(original_text[source(s.cell)], s.cell)
        for s in original.segments
    ]
    assert list(permuted.segments) == expected
    assert len(permuted.text) == len(original.text)
    for i in range(table.n_rows + 1):
        for j in range(table.n_cols):
            start, end = permuted.cell_spans[i][j]
            assert permuted.text[start:end] == original_text[source((i, j))]
