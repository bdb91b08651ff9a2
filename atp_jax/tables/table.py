"""Immutable tables and question-answering examples.

A :class:`Table` is a header row plus data rows of string cells. The attack only ever
reorders a table, so the type is built around one operation, :meth:`Table.permute`,
which reorders data rows and columns while the header stays the first row.

Cell types
----------
Cells are stored as ``str``. Integers and floats (JSON numbers are common in table
dumps), NumPy's among them, are converted with ``str()``. A *missing* cell — ``None``
(JSON ``null``) or a float NaN (pandas' missing value) — becomes the empty cell ``""``,
as the datasets write blank cells; it never becomes the text ``"None"`` or ``"nan"``.
Every other type is rejected with a ``TypeError`` that names the cell: ``str([...])``
would be a Python list literal, not what the author of the table meant. ``bool`` is
rejected too, although it is an ``int`` subclass, because ``"True"`` in a cell almost
always means a bug upstream.

Tables of one's own: :meth:`Table.from_csv` reads a CSV file (first row the header) and
:meth:`Table.from_pandas` a DataFrame (its columns the header). Both strip cells of
surrounding whitespace by default, as the datasets store them. A DataFrame's missing values
(NaN, None, ``pd.NA``, ``NaT``) become empty cells, its booleans ``"True"``/``"False"`` (a
boolean column is data there, as in the CSV it was read from).
"""

from __future__ import annotations

import csv
import math
import numbers
import operator
import os
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Table", "Example"]


def _coerce_cell(value: Any, where: str) -> str:
    """Return ``value`` as a cell string, or raise ``TypeError`` naming ``where``."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""  # a missing cell
    # numbers.Integral/Real admit NumPy scalars; NumPy's bool is neither, Python's bool is Integral.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{where} is {type(value).__name__} {value!r}; cells must be str "
            "(numbers are converted with str(), None and NaN become ''). Convert the value before "
            "building the Table."
        )
    if isinstance(value, numbers.Integral):
        return str(int(value))
    return "" if math.isnan(value) else str(value)


def _coerce_row(row: Any, where: str) -> tuple[str, ...]:
    """Return ``row`` as a tuple of cell strings; reject strings and non-sequences."""
    # A bare string is a Sequence too; accepting it would split "abc" into three cells.
    if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
        raise TypeError(f"{where} must be a list or tuple of cells, got {type(row).__name__} {row!r}")
    return tuple(_coerce_cell(cell, f"{where}, cell {j}") for j, cell in enumerate(row))


def _check_permutation(perm: Any, size: int, name: str) -> tuple[int, ...]:
    """Validate that ``perm`` is a permutation of ``range(size)`` and return it as ints."""
    if isinstance(perm, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ints, got a string {perm!r}")
    try:
        items = list(perm)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(perm).__name__}") from None
    values = []
    for k, item in enumerate(items):
        if isinstance(item, bool):
            raise TypeError(f"{name}[{k}] is a bool; expected an int index")
        try:
            # operator.index accepts int and NumPy integers but refuses floats like 1.0.
            values.append(operator.index(item))
        except TypeError:
            raise TypeError(f"{name}[{k}] is {type(item).__name__} {item!r}; expected an int index") from None
    if len(values) != size:
        raise ValueError(
            f"{name} has length {len(values)} but the table has {size}; pass a permutation of 0..{size - 1}"
        )
    if sorted(values) != list(range(size)):
        raise ValueError(
            f"{name}={values} is not a permutation of 0..{size - 1} (every index must appear exactly once)"
        )
    return tuple(values)


@dataclass(frozen=True)
class Table:
    """A header row plus data rows of string cells.

    Lists are accepted and stored as tuples, so a ``Table`` is immutable and hashable.

    Attributes:
        header: the column names (row 0 of :attr:`cells`). Names may be empty or repeated.
        rows: the data rows; every row is exactly as wide as the header.

    Raises:
        ValueError: if the header has no column, or a row's width differs from the
            header's (the message names the data-row index and both widths).
        TypeError: if a row is not a list/tuple or a cell is not ``str``/``int``/``float``.
    """

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        header = _coerce_row(self.header, "header")
        if not header:
            raise ValueError("a Table needs at least one column; the header is empty")
        if isinstance(self.rows, (str, bytes)) or not isinstance(self.rows, Sequence):
            raise TypeError(f"rows must be a list of rows, got {type(self.rows).__name__}")
        rows = tuple(_coerce_row(row, f"row {i}") for i, row in enumerate(self.rows))
        for i, row in enumerate(rows):
            if len(row) != len(header):
                raise ValueError(
                    f"row {i} has {len(row)} cells but the header has {len(header)}; "
                    "pad or trim the row so that every row is as wide as the header"
                )
        # The dataclass is frozen; object.__setattr__ is the sanctioned way to normalise
        # fields inside __post_init__.
        object.__setattr__(self, "header", header)
        object.__setattr__(self, "rows", rows)

    @property
    def n_rows(self) -> int:
        """Number of data rows (the header is not counted)."""
        return len(self.rows)

    @property
    def n_cols(self) -> int:
        """Number of columns."""
        return len(self.header)

    @property
    def cells(self) -> tuple[tuple[str, ...], ...]:
        """All rows including the header as row 0: ``cells[i][j]``, ``0 <= i <= n_rows``."""
        return (self.header, *self.rows)

    def permute(
        self,
        row_perm: Sequence[int] | None = None,
        col_perm: Sequence[int] | None = None,
    ) -> Table:
        """Reorder data rows and columns; the header stays the first row.

        Slot ``(a, b)`` of the result holds the cell from data row ``row_perm[a]`` and
        column ``col_perm[b]`` of this table, i.e. ``result.rows[a][b] ==
        self.rows[row_perm[a]][col_perm[b]]`` and ``result.header[b] ==
        self.header[col_perm[b]]``.

        Args:
            row_perm: a permutation of ``0..n_rows-1`` (data rows only; the header is
                never moved). ``None`` keeps the row order.
            col_perm: a permutation of ``0..n_cols-1``. ``None`` keeps the column order.
                Any sequence of ints works, including a 1-D NumPy integer array.

        Raises:
            ValueError: if a permutation has the wrong length or repeats/misses an index.
            TypeError: if a permutation holds non-integers.
        """
        rp = tuple(range(self.n_rows)) if row_perm is None else _check_permutation(row_perm, self.n_rows, "row_perm")
        cp = tuple(range(self.n_cols)) if col_perm is None else _check_permutation(col_perm, self.n_cols, "col_perm")
        header = tuple(self.header[j] for j in cp)
        rows = tuple(tuple(self.rows[i][j] for j in cp) for i in rp)
        return Table(header, rows)

    @classmethod
    def from_csv(cls, path: str | os.PathLike, *, strip: bool = True, encoding: str = "utf-8", **fmtparams) -> Table:
        """The table of a CSV file: the first row is the header, the others the data rows.

        Every field is text as written (an empty field is an empty cell; ``NA`` stays ``"NA"``), stripped of
        surrounding whitespace unless ``strip=False``. ``fmtparams`` go to :func:`csv.reader` (``delimiter="\t"``,
        ``escapechar="\\"``, …).

        Raises:
            FileNotFoundError: no such file.
            ValueError: an empty file, or a row of another width than the header (named with its line).
        """
        path = Path(path)
        with path.open(encoding=encoding, newline="") as handle:
            reader = csv.reader(handle, **fmtparams)
            rows = [([cell.strip() for cell in row] if strip else row, reader.line_num) for row in reader]
        if not rows:
            raise ValueError(f"{path} is empty: a CSV table needs a header row")
        header, _ = rows[0]
        for row, line in rows[1:]:
            if len(row) != len(header):
                raise ValueError(
                    f"{path}:{line}: {len(row)} fields but the header has {len(header)}; every row of a table must "
                    "be as wide as its header (pad with empty fields)"
                )
        return cls(header, [row for row, _ in rows[1:]])

    @classmethod
    def from_pandas(cls, frame, *, index: bool = False, strip: bool = True) -> Table:
        """The table of a pandas DataFrame: its column names are the header, its rows the data rows.

        Cells as the module docstring says (NumPy numbers become their text: note that pandas stores an
        integer column with a missing value as floats, ``12`` as ``12.0`` — use the nullable ``Int64`` dtype or
        :meth:`from_csv` to keep the written text). ``index=True`` adds the index as the first column (named by
        ``frame.index.name``, else empty). pandas is needed only here.

        Raises:
            ImportError: pandas is not installed.
            TypeError: not a DataFrame, or a cell of another type (named by row and column).
            ValueError: no columns, or multi-level column names.
        """
        try:
            import pandas as pd  # optional: only this constructor needs it
        except ImportError:
            raise ImportError("Table.from_pandas needs pandas: pip install pandas") from None
        import numpy as np

        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"Table.from_pandas takes a pandas DataFrame, got {type(frame).__name__}")
        if isinstance(frame.columns, pd.MultiIndex):
            raise ValueError(
                "the DataFrame has multi-level column names; join them into one level first, e.g. "
                "frame.columns = [' '.join(map(str, c)).strip() for c in frame.columns]"
            )

        def cell(value, where: str):
            if isinstance(value, str):
                return value.strip() if strip else value
            if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
                return ""
            if isinstance(value, (bool, np.bool_)):
                return str(bool(value))
            if isinstance(value, numbers.Real):
                return value  # the Table writes numbers as text
            raise TypeError(
                f"{where} is {type(value).__name__} {value!r}; convert the column to text first "
                "(e.g. frame[column].astype(str), or .dt.strftime(...) for dates)"
            )

        names = ([frame.index.name] if index else []) + list(frame.columns)
        labels = (["the index"] if index else []) + [f"column {name!r}" for name in frame.columns]
        header = [cell(name, f"the name of {label}") for name, label in zip(names, labels)]
        rows = [
            [cell(value, f"row {i}, {label}") for value, label in zip(values, labels)]
            for i, values in enumerate(frame.itertuples(index=index, name=None))
        ]
        return cls(header, rows)

    def to_dict(self) -> dict[str, list]:
        """The JSONL schema's table object: ``{"header": [...], "rows": [[...], ...]}``."""
        return {"header": list(self.header), "rows": [list(row) for row in self.rows]}


@dataclass(frozen=True)
class Example:
    """One table question with its gold answers.

    Attributes:
        question: the natural-language question.
        table: the table the question is about.
        answers: gold answers as strings (several for multi-answer questions); a list is
            accepted and stored as a tuple.
        id: the dataset's identifier for the question.
        meta: free-form, read-only metadata from the source (e.g. TAT-QA ``scale``).
            It takes part in ``==`` but not in ``hash()`` because mappings are unhashable.
        dataset: the source dataset name (``"wtq"``, ``"tatqa"``, ``"fetaqa"``) or ``""``
            when unknown; it selects the metric in :func:`atp_jax.eval.metrics.score`.
        paragraphs: text that comes with the table (TAT-QA's paragraphs, in their order); a prompt shows them
            only under ``PromptStyle(paragraphs=True)``. A list is accepted and stored as a tuple.
    """

    question: str
    table: Table
    answers: tuple[str, ...]
    id: str
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)
    dataset: str = ""
    paragraphs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.question, str):
            raise TypeError(f"question must be str, got {type(self.question).__name__}")
        if not isinstance(self.table, Table):
            raise TypeError(f"table must be a Table, got {type(self.table).__name__}")
        if not isinstance(self.id, str):
            raise TypeError(f"id must be str, got {type(self.id).__name__}")
        if not isinstance(self.dataset, str):
            raise TypeError(f"dataset must be str, got {type(self.dataset).__name__}")
        if isinstance(self.answers, (str, bytes)) or not isinstance(self.answers, Sequence):
            raise TypeError(
                f"answers must be a list of strings, got {type(self.answers).__name__} "
                f"{self.answers!r}; wrap a single answer as [answer]"
            )
        answers = tuple(self.answers)
        for k, answer in enumerate(answers):
            if not isinstance(answer, str):
                raise TypeError(f"answers[{k}] is {type(answer).__name__} {answer!r}; answers must be str")
        if isinstance(self.paragraphs, (str, bytes)) or not isinstance(self.paragraphs, Sequence):
            raise TypeError(f"paragraphs must be a list of strings, got {type(self.paragraphs).__name__}")
        paragraphs = tuple(self.paragraphs)
        for k, paragraph in enumerate(paragraphs):
            if not isinstance(paragraph, str):
                raise TypeError(f"paragraphs[{k}] is {type(paragraph).__name__} {paragraph!r}; paragraphs must be str")
        if not isinstance(self.meta, Mapping):
            raise TypeError(f"meta must be a mapping, got {type(self.meta).__name__}")
        object.__setattr__(self, "answers", answers)
        object.__setattr__(self, "paragraphs", paragraphs)
        # A read-only view of a private copy: the caller's dict cannot change the example.
        object.__setattr__(self, "meta", types.MappingProxyType(dict(self.meta)))
