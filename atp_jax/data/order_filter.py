"""Whether a question's correct answer depends on the order its table is presented in.

A permutation attack reorders a table's rows and columns, so it only measures fragility on
questions whose correct answer survives every reordering: on "which team is listed last?"
a model that changes its answer after a shuffle is right, not fooled. Such questions are
dropped before an attack. Two rules find them (:data:`ORDER_FILTERS` names both):

``"keywords"``
    The paper's candidate rule, :func:`is_order_sensitive`: the question contains
    first/last/top/next/previous/above/below/before/after. It flags every question that
    says "first" or "top" about content too ("who finished first?" over a Rank column,
    "first name", "top speed"), so it drops far more than the order-dependent questions.

``"classifier"``
    :func:`is_order_dependent`, which reads the question *and* the table. A question is
    order-dependent when it refers to the presentation ("listed", "on the chart", "at the
    top", "the row above X"), or when it asks for the entity before/after another one and
    no column of the table can tell the two apart (no rank, number, year or date column,
    or one that ties on those two rows). When a column carries the order the question
    refers to ("the race after X" over a Date column), the answer is recoverable from the
    content and the question stays. :func:`order_verdict` also returns the deciding rule.

Each rule set below says why it exists. ``docs/order_filter.md`` reports how the classifier
agrees with hand labels of WTQ dev questions and what fraction of each dataset it drops;
``python -m atp_jax.data.order_report DATA_DIR`` recomputes those figures.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from atp_jax.tables.table import Example, Table

__all__ = [
    "DEFAULT_ORDER_FILTER",
    "ORDER_EXCLUSIONS",
    "ORDER_FILTERS",
    "ORDER_KEYWORDS",
    "OrderVerdict",
    "is_order_dependent",
    "is_order_sensitive",
    "order_rule",
    "order_verdict",
]

# --------------------------------------------------------------------------- the keyword rule

ORDER_KEYWORDS = re.compile(r"\b(first|last|top|next|previous|above|below|before|after)\b", re.IGNORECASE)
"""The paper's order-keyword rule."""

ORDER_EXCLUSIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"\b(?:before|after)[\s-]+(?:income[\s-]+)?tax(?:es|ation)?\b", re.IGNORECASE),
        (
            "financial line items such as 'income before income taxes' or 'profit after tax' "
            "name an amount, not a position (TAT-QA)"
        ),
    ),
    (
        re.compile(r"\bbefore\s+interest\b", re.IGNORECASE),
        "'earnings before interest and taxes' (EBIT/EBITDA) is a line item, not a position",
    ),
    (
        re.compile(r"\btop\s+speeds?\b", re.IGNORECASE),
        "'top speed' is a vehicle attribute (WTQ), not the top of the table",
    ),
)
"""Phrases removed before the keyword rule is applied, with the reason for each.

The list is kept short on purpose: only phrases whose keyword can never refer to row or
column position. "first name"/"last name" are *not* excluded because WTQ also asks
"what is the first name on the list?", which is about order.
"""


def _without_exclusions(question: str) -> str:
    for pattern, _reason in ORDER_EXCLUSIONS:
        question = pattern.sub(" ", question)
    return question


def is_order_sensitive(question: str) -> bool:
    """True when the question uses an order keyword outside the excluded phrases.

    >>> is_order_sensitive("which team won previous to crettyard?")
    True
    >>> is_order_sensitive("What was the change in income before income taxes?")
    False
    >>> is_order_sensitive("what was the first income before taxes listed?")
    True
    """
    return ORDER_KEYWORDS.search(_without_exclusions(question)) is not None


# --------------------------------------------------------------------------- the classifier


@dataclass(frozen=True)
class OrderVerdict:
    """The classifier's decision on one example.

    Attributes:
        dependent: whether the correct answer depends on the table's presentation order.
        rule: the name of the rule that decided (a key of the rule sets below, or
            ``"relative-unseparated"`` / ``"relative-separated"`` / ``"no-rule"``).
        evidence: the matched question text, and for the relative rules the row and column
            that did (or could not) tell the two entities apart.
    """

    dependent: bool
    rule: str
    evidence: str = ""


def _rules(**patterns: str) -> dict[str, re.Pattern[str]]:
    return {name: re.compile(pattern, re.IGNORECASE) for name, pattern in patterns.items()}


_POSITION = r"(?:first|last|top|bottom|next|previous|final|second|third|fourth|fifth)"
_FEW_WORDS = r"(?:\s+[^\s?,;]+){0,4}?"  # up to four words between a position and its anchor
_PRESENTED = r"(?:list|table|chart|roster|page)"  # nouns that name the table itself
_NUMBER = (
    r"(?:[-−–+$£€]?\d|(?:one|two|three|four|five|six|seven|eight|nine|ten|twenty|fifty|hundred"
    r"|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)\b)"
)

CONTENT_QUESTIONS: dict[str, re.Pattern[str]] = _rules(
    # "next oldest", "next highest elevation after X": the question ranks a value, so any
    # row order gives the same answer, even when the question adds "listed" or "after X".
    ranked_value=r"\b(?:next|second|third)[\s-]+(?:\w+est|most|least|best|worst)\b",
    # "how long after the founding of X was Y founded?": a difference of two values.
    time_difference=r"\bhow\s+(?:long|many\s+years|much\s+time)\s+(?:\w+\s+){0,2}?(?:after|before)\b",
    # "what was the next year where another tom would be elected?": a later value of a
    # year column.
    adjacent_year=r"\b(?:next|following|previous|prior)\s+(?:year|season|month|date)\b",
)
"""Questions whose order word is about values: independent, whatever else they say."""

CONTENT_PHRASES: dict[str, re.Pattern[str]] = _rules(
    # "first place", "third place": a result the table states, as in "how many times was
    # first place listed as the position?".
    result_place=r"\b(?:first|second|third|last)\s+place\b",
    # "listed before 1965", "listed in 1979": 'listed' is a listing date, not a place in the table.
    listing_date=r"\blisted\s+(?:before|after|in|since|until)\s+(?:(?:1\d|20)\d\d\b|the\s+year\b)",
    # "is mount keith above or below north palisade?": a comparison of two values (but
    # "listed above or below" asks where a row is).
    above_or_below=r"(?<!listed\s)\b(?:above\s+or\s+below|below\s+or\s+above)\b",
    # TAT-QA line items and accounting states: "after adoption of the new standard",
    # "falling due after more than one year", "after adjustment".
    accounting_state=r"\b(?:before|after)\s+(?:the\s+)?(?:adoption|adjustments?|more\s+than)\b",
)
"""Phrases masked before the presentation and relative rules, because their order word
refers to content (the keyword rule's :data:`ORDER_EXCLUSIONS` are masked too)."""

PRESENTATION_PHRASES: dict[str, re.Pattern[str]] = _rules(
    # "the first listed country", "the last member listed whose ...", "the next title listed".
    position_then_listed=rf"\b{_POSITION}\b{_FEW_WORDS}\s+listed\b",
    # "listed last", "listed previous to belgium", "listed next after", "listed at the top".
    listed_then_position=r"\blisted\s+(?:just\s+|right\s+|directly\s+|immediately\s+)?"
    r"(?:first|last|next|previous|above|below|before|after|prior|at\s+the\s+(?:top|bottom)|on\s+top)\b",
    # "the first country on the table", "the last performer on this chart", "first on the
    # roster", "top of the list", "just before del norte on the list": the table is the
    # reference frame.
    position_on_the_table=rf"\b(?:{_POSITION}|before|after|above|below|prior)\b{_FEW_WORDS}"
    rf"\s+(?:on|in|of|at)\s+(?:the\s+|this\s+|that\s+)?{_PRESENTED}\b",
    # "what ethnicity is at the top?": with no 'of ...', 'the top' is the top of the table
    # (but "at the top of all else" and "the top 10 routes" are not).
    at_the_top=r"\bat\s+the\s+(?:top|bottom)\b(?!\s+of\b|\s*\d)",
    # "the nation above algeria", "the name below it": above/below an entity is a row
    # position; above/below a number ("goals above 15") or "above or below" compares values.
    above_or_below_an_entity=rf"\b(?:above|below|beneath|underneath)\s+(?!or\b|and\b|the\s+average\b|average\b"
    rf"|freezing\b|zero\b|par\b|{_NUMBER})\w",
    # "the winner next to mount leinster rangers": adjacency in the layout (but "next to
    # finish" is "the next one to finish").
    next_to=r"\bnext\s+to\s+(?!last\b|finish\b|win\b|score\b|be\b|play\b|arrive\b|leave\b)\w",
    # "the first row", "the last column", "the next entry".
    row_or_column=rf"\b{_POSITION}\s+(?:row|column|entry|line|item)s?\b",
)
"""Phrases that refer to the table as presented: the question is order-dependent."""

RELATIVE_PHRASE = re.compile(
    r"\b(?:before|after|previous\s+to|prior\s+to|preceding|(?<!the\s)following|next\s+after)\s+(?P<anchor>[^?;,]+)",
    re.IGNORECASE,
)
"""'before/after/previous to X': order-dependent only when no column tells X's row from the
neighbouring row (see :func:`order_verdict`). The entity ends at the clause ("after the election,
how many seats ..."); "the following" introduces content, not a neighbour."""

RANKED_ABOVE = re.compile(
    r"\b(finish(?:ed|es)?|place[sd]?|rank(?:ed|s)?|came|comes?|score[sd]?)\s+((?:immediately|directly|just|right)\s+)?"
    r"(above|below)\b",
    re.IGNORECASE,
)
"""'finished above X', 'ranked below X': a rank, not a row position, so they are read as
'before X' / 'after X' and go through the relative rule, where a Rank column decides."""

YES_NO = re.compile(r"^\s*(?:is|was|were|are|did|does|do|has|had)\b", re.IGNORECASE)
"""'Was X inaugurated before Y?': a yes/no question compares two entities' values, so a
column with a value on X's row is enough to answer it."""

ORDER_HEADER = re.compile(
    r"#|\b(?:rank|ranking|pos|position|place|no|nr|number|year|years|date|dates|season|round|rd|edition"
    r"|game|week|pick|draw|tie|episode|ep|term|tenure|founded|built|elected|office|released?|birth|born"
    r"|premi[eè]re|inaugurat\w*|appointed|appointment|kilometers?|km|mile|miles)\b",
    re.IGNORECASE,
)
"""Headers of columns that can carry a sequence: ranks, numbers, years, dates, rounds."""

_MONTHS = {
    m: k
    for k, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], start=1)
}
_MONTH = r"(?P<month>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DATE_FORMS = (
    re.compile(rf"\b{_MONTH}\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?,?\s+(?P<year>\d{{4}})\b", re.IGNORECASE),
    re.compile(rf"\b(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH},?\s+(?P<year>\d{{4}})\b", re.IGNORECASE),
    re.compile(r"\b(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})\b"),
    re.compile(r"\b(?P<month>\d{1,2})[-–/](?P<day>\d{1,2})[-–/](?P<year>\d{4})\b"),
    re.compile(rf"\b{_MONTH}\s+(?P<year>\d{{4}})\b", re.IGNORECASE),
    re.compile(rf"\b{_MONTH}\s+(?P<day>\d{{1,2}})\b", re.IGNORECASE),
    re.compile(rf"\b(?P<day>\d{{1,2}})\s+{_MONTH}\b", re.IGNORECASE),
)
_YEAR = re.compile(r"^\D{0,3}(?P<year>1\d{3}|20\d{2})(?!\d)")
_TIME = re.compile(r"^\+?\s*(?:(?P<hours>\d+):)?(?P<minutes>\d{1,2}):(?P<seconds>\d{2}(?:\.\d+)?)")
_MEDALS = {"gold": 1.0, "silver": 2.0, "bronze": 3.0}
_NUMBER_IN_CELL = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _order_key(cell: str) -> float | None:
    """The position a cell states in a sequence (a date, race time, year, season, medal or number), or None.

    Keys are only compared within one column, so the scales of the forms need not agree
    beyond dates > years-with-months > years, which share a year * 10000 scale.
    """
    text = cell.strip().replace(",", "")
    if not text:
        return None
    for form in _DATE_FORMS:
        found = form.search(text)
        if found:
            parts = found.groupdict()
            month = parts.get("month")
            month = _MONTHS[month[:3].lower()] if month and not month.isdigit() else int(month or 0)
            return int(parts.get("year") or 0) * 10000 + month * 100 + int(parts.get("day") or 0)
    time = _TIME.search(text)  # a race time, "1:57.08" or "1:31:33.736"
    if time:
        return int(time["hours"] or 0) * 3600 + int(time["minutes"]) * 60 + float(time["seconds"])
    year = _YEAR.search(text)
    if year:
        return int(year["year"]) * 10000.0
    if text.lower() in _MEDALS:
        return _MEDALS[text.lower()]
    number = _NUMBER_IN_CELL.search(text)
    return float(number.group()) if number else None


def _is_monotone(keys: Sequence[float | None]) -> bool:
    """Whether the parsed keys of a column rise (or fall) down the rows: a sequence column."""
    values = [k for k in keys if k is not None]
    # Four values or more: three values of an unordered column are monotone one time in three.
    if len(values) < 4 or len(values) < 0.8 * len(keys) or len(set(values)) < 3:
        return False
    steps = [b - a for a, b in itertools.pairwise(values)]
    return all(s >= 0 for s in steps) or all(s <= 0 for s in steps)


def _is_dated(cells: Sequence[str]) -> bool:
    """Whether most non-empty cells of a column are dates ("16 October 1944"): a date orders events."""
    filled = [cell for cell in cells if cell.strip()]
    dated = sum(any(form.search(cell) for form in _DATE_FORMS[:4]) for cell in filled)
    return bool(filled) and dated >= 0.6 * len(filled)


def _order_columns(table: Table) -> list[int]:
    """Columns that can carry a sequence: by their header, their dates, or because their values rise or fall."""
    columns = []
    for j, name in enumerate(table.header):
        cells = [row[j] for row in table.rows]
        if ORDER_HEADER.search(name) or _is_dated(cells) or _is_monotone([_order_key(c) for c in cells]):
            columns.append(j)
    return columns


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[\"“”'‘’()]", " ", text.lower()).split())


def _anchor_row(table: Table, phrase: str) -> tuple[int, str] | None:
    """The row the phrase names: the row with the most cell text found in the phrase (the one
    found earliest on a tie), as (row index, its longest cell found)."""
    phrase = _normalize(phrase)
    best: tuple[int, int, int, str] | None = None  # (-matched length, start, row, cell)
    for i, row in enumerate(table.rows):
        found = {}
        for cell in row:
            name = _normalize(cell)
            hit = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", phrase) if len(name) >= 3 else None
            if hit:
                found[name] = hit.start()
        if found:
            key = (-sum(map(len, found)), min(found.values()), i, max(found, key=len))
            best = key if best is None or key < best else best
    return None if best is None else (best[2], best[3])


_SUMMARY_CELLS = {"total", "totals", "career total", "overall", "sum"}


def _neighbour(table: Table, row: int, backwards: bool) -> int | None:
    """The closest row before (or after) ``row`` that is not a summary row such as "Total"."""
    step = -1 if backwards else 1
    k = row + step
    while 0 <= k < table.n_rows and any(_normalize(c) in _SUMMARY_CELLS for c in table.rows[k]):
        k += step
    return k if 0 <= k < table.n_rows else None


def _separating_column(table: Table, row: int, neighbour: int) -> int | None:
    """An order column whose values tell ``row`` from ``neighbour`` apart, or None."""
    for j in _order_columns(table):
        a, b = _order_key(table.rows[row][j]), _order_key(table.rows[neighbour][j])
        if a is not None and b is not None and a != b:
            return j
    return None


def _masked(question: str) -> str:
    """The question with its content phrases blanked and 'ranked above X' read as 'ranked before X'."""
    text = _without_exclusions(question)
    for pattern in CONTENT_PHRASES.values():
        text = pattern.sub(" ", text)
    return RANKED_ABOVE.sub(lambda m: f"{m[1]} {m[2] or ''}{'before' if m[3].lower() == 'above' else 'after'}", text)


def _relative_verdict(table: Table, found: re.Match[str], yes_no: bool) -> OrderVerdict | None:
    """The verdict on one 'before/after X' phrase, or None when X is a value or is not in the table."""
    phrase = found.group().strip()
    anchor = found["anchor"].strip()
    if re.match(_NUMBER, anchor):  # "after 1999", "before 17 february 1976": a comparison
        return None
    located = _anchor_row(table, anchor)
    if located is None:
        return None
    row, name = located
    if yes_no:  # "was X before Y?": X's own value answers it
        column = next((j for j in _order_columns(table) if _order_key(table.rows[row][j]) is not None), None)
        if column is None:
            return OrderVerdict(True, "relative-unseparated", f"{phrase!r}: no order column has a value on row {row}")
        return OrderVerdict(
            False,
            "relative-separated",
            f"{phrase!r}: column {table.header[column]!r} has a value on row {row} ({name!r})",
        )
    backwards = not re.match(r"(?:after|following|next)", phrase, re.IGNORECASE)
    neighbour = _neighbour(table, row, backwards)
    if neighbour is None:  # X is the first (last) row: the question reads the table the other way
        neighbour = _neighbour(table, row, not backwards)
    if neighbour is None:
        return None
    column = _separating_column(table, row, neighbour)
    if column is None:
        return OrderVerdict(
            True, "relative-unseparated", f"{phrase!r}: no order column tells row {row} ({name!r}) from row {neighbour}"
        )
    return OrderVerdict(
        False,
        "relative-separated",
        f"{phrase!r}: column {table.header[column]!r} orders row {row} ({name!r}) and row {neighbour}",
    )


def order_verdict(example: Example) -> OrderVerdict:
    """Decide whether ``example``'s answer depends on its table's presentation order, and why.

    Rules, in order: a question about values (:data:`CONTENT_QUESTIONS`) is independent;
    content phrases are masked (:data:`CONTENT_PHRASES`, :data:`ORDER_EXCLUSIONS`) and
    'ranked above X' is read as 'ranked before X' (:data:`RANKED_ABOVE`); a presentation
    phrase (:data:`PRESENTATION_PHRASES`) makes the question dependent; 'before/after X'
    (:data:`RELATIVE_PHRASE`) with X found in a row is dependent unless an order column
    (:data:`ORDER_HEADER`, a date column, or a column whose values rise or fall) has
    different values on X's row and on the neighbouring row in that direction (summary rows
    such as "Total" skipped; for a yes/no question, a value on X's row suffices); anything
    else is independent.
    """
    for name, pattern in CONTENT_QUESTIONS.items():
        found = pattern.search(example.question)
        if found:
            return OrderVerdict(False, name, found.group())
    text = _masked(example.question)
    for name, pattern in PRESENTATION_PHRASES.items():
        found = pattern.search(text)
        if found:
            return OrderVerdict(True, name, found.group())
    yes_no = YES_NO.match(text) is not None
    for found in RELATIVE_PHRASE.finditer(text):
        verdict = _relative_verdict(example.table, found, yes_no)
        if verdict is not None:
            return verdict
    return OrderVerdict(False, "no-rule")


def is_order_dependent(example: Example) -> bool:
    """True when the correct answer would change under a reordering of the table (see :func:`order_verdict`)."""
    return order_verdict(example).dependent


# --------------------------------------------------------------------------- choosing a rule

ORDER_FILTERS: dict[str, Callable[[Example], bool]] = {
    "classifier": is_order_dependent,
    "keywords": lambda example: is_order_sensitive(example.question),
}
"""The order rules by name: each says whether an example's answer depends on its table's order."""

DEFAULT_ORDER_FILTER = "classifier"


def order_rule(name: str) -> Callable[[Example], bool]:
    """The order rule called ``name`` (one of :data:`ORDER_FILTERS`).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    try:
        return ORDER_FILTERS[name]
    except KeyError:
        raise ValueError(f"unknown order filter {name!r}: use one of {', '.join(ORDER_FILTERS)}") from None
