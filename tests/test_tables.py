"""Tests for atp_jax.tables.table: validation, permutation and Example."""

import csv
import dataclasses
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atp_jax.tables.table import Example, Table


def small_table():
    return Table(
        ["Team", "County", "Wins"],
        [["Greystones", "Wicklow", "1"], ["Maynooth", "Kildare", "2"], ["Confey", "Kildare", "3"]],
    )


# ------------------------------------------------------------------ construction


def test_lists_are_stored_as_tuples_and_shape_properties():
    table = small_table()
    assert table.header == ("Team", "County", "Wins")
    assert isinstance(table.rows, tuple) and all(isinstance(r, tuple) for r in table.rows)
    assert table.n_rows == 3 and table.n_cols == 3
    assert table.cells[0] == ("Team", "County", "Wins")
    assert table.cells[2] == ("Maynooth", "Kildare", "2")
    assert len(table.cells) == table.n_rows + 1
    hash(table)  # Immutable, so hashable.


def test_table_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        small_table().rows = ()


def test_header_only_table_is_allowed():
    table = Table(["a", "b"], [])
    assert table.n_rows == 0 and table.cells == (("a", "b"),)


def test_ragged_row_names_the_row_and_both_widths():
    with pytest.raises(ValueError, match=r"row 1 has 1 cells but the header has 2"):
        Table(["a", "b"], [["1", "2"], ["3"]])
    with pytest.raises(ValueError, match=r"row 0 has 3 cells but the header has 2"):
        Table(["a", "b"], [["1", "2", "3"]])


def test_empty_header_is_rejected():
    with pytest.raises(ValueError, match="at least one column"):
        Table([], [])
    with pytest.raises(ValueError, match="at least one column"):
        Table([], [[]])


def test_numbers_are_converted_with_str():
    table = Table(["n", "x"], [[1, 2.5]])
    assert table.rows == (("1", "2.5"),)


@pytest.mark.parametrize("bad", [True, ["x"], b"bytes", {"a": 1}, np.bool_(True)])
def test_other_cell_types_are_rejected_with_their_position(bad):
    with pytest.raises(TypeError, match=r"row 1, cell 0"):
        Table(["a"], [["ok"], [bad]])


def test_bad_header_cell_is_named():
    with pytest.raises(TypeError, match=r"header, cell 1"):
        Table(["a", ["b"]], [])


def test_string_header_or_row_is_rejected():
    with pytest.raises(TypeError, match="header must be a list"):
        Table("abc", [])
    with pytest.raises(TypeError, match="row 0 must be a list"):
        Table(["a", "b"], ["xy"])


# ------------------------------------------------------------------ permute


def test_permute_hand_written_case():
    table = small_table()
    result = table.permute([2, 0, 1], [1, 2, 0])
    # Slot (a, b) holds data row row_perm[a], column col_perm[b]; the header stays first.
    assert result.header == ("County", "Wins", "Team")
    assert result.rows == (
        ("Kildare", "3", "Confey"),
        ("Wicklow", "1", "Greystones"),
        ("Kildare", "2", "Maynooth"),
    )
    assert table.rows[0] == ("Greystones", "Wicklow", "1")  # The original is unchanged.


def test_permute_none_is_identity_and_numpy_arrays_work():
    table = small_table()
    assert table.permute() == table
    assert table.permute(np.array([0, 1, 2]), np.arange(3)) == table
    assert table.permute(None, [2, 1, 0]).rows[0] == ("1", "Wicklow", "Greystones")


@pytest.mark.parametrize(
    "row_perm, col_perm, error, message",
    [
        ([0, 1], None, ValueError, "row_perm has length 2 but the table has 3"),
        (None, [0, 1, 2, 3], ValueError, "col_perm has length 4 but the table has 3"),
        ([0, 0, 1], None, ValueError, "not a permutation of 0..2"),
        ([1, 2, 3], None, ValueError, "not a permutation of 0..2"),
        (None, [0.0, 1, 2], TypeError, r"col_perm\[0\] is float"),
        ([True, 0, 1], None, TypeError, "bool"),
        ("012", None, TypeError, "string"),
    ],
)
def test_permute_rejects_bad_permutations(row_perm, col_perm, error, message):
    with pytest.raises(error, match=message):
        small_table().permute(row_perm, col_perm)


@st.composite
def tables_and_perms(draw):
    n_rows = draw(st.integers(0, 5))
    n_cols = draw(st.integers(1, 5))
    # Unique cell labels make every cell traceable.
    header = [f"h{j}" for j in range(n_cols)]
    rows = [[f"r{i}c{j}" for j in range(n_cols)] for i in range(n_rows)]
    row_perm = draw(st.permutations(list(range(n_rows))))
    col_perm = draw(st.permutations(list(range(n_cols))))
    return Table(header, rows), row_perm, col_perm


@settings(max_examples=60, deadline=None)
@given(tables_and_perms())
def test_permute_matches_permutation_matrices(case):
    table, row_perm, col_perm = case
    n, m = table.n_rows, table.n_cols
    # Reference: the full (n+1) x m grid of cell ids multiplied by one-hot matrices,
    # with the row matrix's header entry fixed at (0, 0).
    ids = np.arange((n + 1) * m).reshape(n + 1, m)
    p_rows = np.zeros((n + 1, n + 1), dtype=int)
    p_rows[0, 0] = 1
    for a, source in enumerate(row_perm):
        p_rows[a + 1, source + 1] = 1
    p_cols = np.zeros((m, m), dtype=int)
    for b, source in enumerate(col_perm):
        p_cols[source, b] = 1
    expected_ids = p_rows @ ids @ p_cols
    flat = [cell for row in table.cells for cell in row]
    expected = [[flat[k] for k in row] for row in expected_ids]

    result = table.permute(row_perm, col_perm)
    assert [list(row) for row in result.cells] == expected
    assert result.header == tuple(table.header[j] for j in col_perm)  # Header pinned first.
    assert sorted(map(tuple, result.rows)) == sorted(tuple(row[j] for j in col_perm) for row in table.rows)


# ------------------------------------------------------------------ Example


def test_example_stores_tuples_and_read_only_meta():
    meta = {"scale": "million"}
    example = Example("q?", small_table(), ["a", "b"], "id-1", meta, dataset="tatqa")
    assert example.answers == ("a", "b")
    meta["scale"] = "changed"  # The example keeps its own copy.
    assert example.meta["scale"] == "million"
    with pytest.raises(TypeError):
        example.meta["scale"] = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.question = "other"
    same = Example("q?", small_table(), ("a", "b"), "id-1", {"scale": "million"}, dataset="tatqa")
    assert example == same and hash(example) == hash(same)


def test_example_validates_types():
    table = small_table()
    with pytest.raises(TypeError, match="answers must be a list"):
        Example("q", table, "single answer", "id")
    with pytest.raises(TypeError, match=r"answers\[1\] is int"):
        Example("q", table, ["a", 3], "id")
    with pytest.raises(TypeError, match="table must be a Table"):
        Example("q", {"header": []}, ["a"], "id")
    with pytest.raises(TypeError, match="id must be str"):
        Example("q", table, ["a"], 7)


def test_missing_cells_are_empty_and_numpy_numbers_are_text():
    table = Table(["a", None, "c"], [[None, float("nan"), np.float64("nan")], [np.int64(3), np.float32(0.5), 2.5]])
    assert table.header == ("a", "", "c")
    assert table.rows == (("", "", ""), ("3", "0.5", "2.5"))


def test_example_paragraphs_are_a_tuple_of_strings():
    example = Example("q", small_table(), ["a"], "id", paragraphs=["One.", "Two."])
    assert example.paragraphs == ("One.", "Two.")
    with pytest.raises(TypeError, match="paragraphs must be a list"):
        Example("q", small_table(), ["a"], "id", paragraphs="One.")
    with pytest.raises(TypeError, match=r"paragraphs\[0\] is int"):
        Example("q", small_table(), ["a"], "id", paragraphs=[1])


# ------------------------------------------------------------------ tables of one's own: CSV and pandas

ROWS = [
    ["Player", "Goals", "Note"],
    ["Alice", "12", 'said "hi", then left'],  # quotes and a comma inside a field
    ["Bob", "", "two\nlines"],  # an empty field, a line break inside a field
    ["  Carol ", "7", "NA"],  # surrounding whitespace; NA is text in a CSV
]


def test_from_csv_reads_what_the_standard_writer_wrote(tmp_path):
    path = tmp_path / "table.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows(ROWS)
    table = Table.from_csv(path)
    assert table.header == tuple(ROWS[0])
    assert table.rows == tuple(tuple(cell.strip() for cell in row) for row in ROWS[1:])
    assert Table.from_csv(path, strip=False).rows[2][0] == "  Carol "
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle, delimiter="\t").writerows(ROWS)
    assert Table.from_csv(path, delimiter="\t") == table


def test_from_csv_names_the_problem(tmp_path):
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b\n1,2\n3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ragged\.csv:3: 1 fields but the header has 2"):
        Table.from_csv(ragged)
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="empty: a CSV table needs a header row"):
        Table.from_csv(empty)
    with pytest.raises(FileNotFoundError):
        Table.from_csv(tmp_path / "missing.csv")


def test_from_pandas_numpy_dtypes_and_missing_values():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {
            "int64": np.array([12, -3], dtype=np.int64),
            "float64": np.array([0.5, np.nan], dtype=np.float64),
            "bool": np.array([True, False]),
            "object": [" x ", None],
            "nullable": pd.array([7, pd.NA], dtype="Int64"),
            "when": pd.to_datetime(["2020-01-02", None]).strftime("%Y-%m-%d"),  # NaT formats to NaN
        }
    )
    assert [str(t) for t in frame.dtypes[:3]] == ["int64", "float64", "bool"]
    table = Table.from_pandas(frame)
    assert table.header == ("int64", "float64", "bool", "object", "nullable", "when")
    assert table.rows == (("12", "0.5", "True", "x", "7", "2020-01-02"), ("-3", "", "False", "", "", ""))
    indexed = Table.from_pandas(frame.set_index("int64"), index=True)
    assert indexed == table
    assert Table.from_pandas(pd.DataFrame({0: [1], 1: ["a"]})).header == ("0", "1")


def test_from_pandas_agrees_with_from_csv_on_the_same_file(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "table.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([["Team", "Wins", "Champion"], ["A", "3", "True"], ["B", "", "False"]])
    # Read as text, pandas gives the CSV's own fields; its missing-value guess (NaN for the empty field) is empty too.
    assert Table.from_pandas(pd.read_csv(path, dtype=str)) == Table.from_csv(path)
    # With pandas' type inference the empty field makes Wins a float column: 3 becomes 3.0 (documented).
    inferred = Table.from_pandas(pd.read_csv(path))
    assert inferred.rows == (("A", "3.0", "True"), ("B", "", "False"))


def test_from_pandas_refuses_what_it_cannot_write():
    pd = pytest.importorskip("pandas")
    with pytest.raises(TypeError, match="takes a pandas DataFrame, got list"):
        Table.from_pandas([[1, 2]])
    with pytest.raises(TypeError, match=r"row 0, column 'when' is Timestamp .*astype\(str\)"):
        Table.from_pandas(pd.DataFrame({"when": pd.to_datetime(["2020-01-02"])}))
    with pytest.raises(ValueError, match="multi-level column names"):
        Table.from_pandas(pd.DataFrame([[1, 2]], columns=pd.MultiIndex.from_tuples([("a", "x"), ("a", "y")])))


def test_from_pandas_without_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails as where it is not installed
    with pytest.raises(ImportError, match="Table.from_pandas needs pandas: pip install pandas"):
        Table.from_pandas(object())
