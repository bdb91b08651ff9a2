"""Answer metrics for WikiTableQuestions, TAT-QA and FeTaQA.

The WTQ and TAT-QA metrics reimplement the official evaluators rule for rule, quirks included, so that a score
here is the score the official code gives to the same prediction. The project's prompt asks for several answers
separated by ``|``; a free-text prediction becomes the official evaluators' input exactly one way: split on ``|``
(each item stripped) when it contains one, otherwise kept whole. No other separator is recognised.

WTQ — denotation accuracy
    Follows ``evaluator.py`` version 1.0.2 of ppasupat/WikiTableQuestions (commit 7d455a5a707b), whose Python 2
    ``int()``/``float()`` semantics are kept. Each string is normalised (:func:`normalize_wtq`) and typed as a
    number, a date or a string (:func:`to_value`); a gold item is typed by its CoreNLP canonical value
    (``targetCanon``, ``meta["target_canon"]`` in converted records), a predicted item by its own text. The
    prediction is correct when it has as many distinct values as the gold and every gold value matches one of
    them (:func:`check_denotation`): equal normalised text, or two numbers within 1e-6, or two dates with the
    same (year, month, day).

    Quirks of the official evaluator reproduced on purpose:

    * Predictions get no canonical values: ``"10,727"``, ``"12%"``, ``"$5"``, ``"17 years"`` and
      ``"November 11, 1972"`` are strings when predicted, even where the same gold is a number or a date.
    * A number within 1e-6 of an integer is *truncated* to it: ``6.9999999`` is 6 (and wrong for gold 7),
      ``7.0000001`` is 7.
    * Numbers and date parts are read with Python's ``int()``/``float()``: surrounding whitespace, a ``+`` sign,
      leading zeros, an exponent and non-ASCII decimal digits are accepted (``"+2001-3-4"`` and
      ``" 2001 - 03 - 04 "`` are the date 2001-03-04, ``"１２"`` is 12); ``_`` inside a number is not, as in
      Python 2; ``nan`` and ``inf`` are strings.
    * A date ``yyyy-xx-xx`` (year only) is the number ``yyyy``.
    * Normalisation drops one trailing ``.``, trailing ``(details)``, citations ``[1]`` and marks ``*#+†‡•♦``,
      and one pair of outer double quotes, but keeps single quotes, ``!``, commas and a leading "the".
    * An empty item counts as a value: ``"A | B |"`` has three values and is wrong for gold ``A | B``; a blank
      prediction has none.
    * Duplicates are dropped before the sizes are compared (``"A | A | B"`` is right for gold ``A | B``).

    Gold without canonical values (the converted WTQ dev records carry none): each gold item is typed as the
    official evaluator types an item whose ``targetCanon`` is empty, by its own text, with one approximation of
    CoreNLP applied to gold only (:func:`approximate_canon`): a number written with comma thousands separators
    (``"12,467"``) is that number, as CoreNLP always makes it. Other canonicalisations (units, ordinals, dates in
    words) are not guessed, so for such gold a prediction that the official evaluator would accept through the
    canonical value (``17`` for ``17 years``) scores 0 here; the gold as written always scores 1.

TAT-QA — exact match and F1
    Follows ``tatqa_metric.py`` and ``tatqa_utils.py`` of NExTplusplus/TAT-QA (commit 870accc41953) as
    ``tatqa_eval.py`` calls them with an empty predicted scale. Gold and prediction are each rendered as one
    string (:func:`tatqa_answer_string`): items sorted, numbers written ``"%.4f"`` after applying the scale, then
    joined by spaces. EM is equality of the normalised strings (:func:`tatqa_normalize_answer`), F1 the
    bag-of-words F1 between them rounded to 2 decimals, and for ``arithmetic``/``count`` questions F1 is set to EM.

    Quirks of the official metric reproduced on purpose:

    * A bare number gets no scale: gold ``1.5`` with scale million is 1500000, and ``"1.5"`` is wrong while
      ``"1.5 million"``, ``"1,500,000"`` and ``"$1.5 million"`` are right; a scale word the gold lacks makes a
      number wrong. A percent gold is matched by ``"12.5%"``, ``"12.5 percent"`` or the fraction ``0.125``.
    * A number written without ``%``, gold or predicted, is rounded to 2 decimals before the scale is applied:
      ``3.004`` matches gold ``3`` and ``3.006`` does not. A single predicted bare number is also tried
      unrounded, which is how the fraction ``0.2342`` matches gold ``23.42`` percent.
    * Only the first number of an answer counts, with the first scale word that follows a digit, a sign from
      ``(digits)`` and a percent from ``digits%`` anywhere in it ("in a sentence" answers fail EM).
    * Multi-span items are sorted and joined into one string, so order does not matter, an empty item (a trailing
      ``|``) vanishes, and ``", "``, ``";"``, ``" and "`` inside an item are ordinary text compared word by word.
    * A word that Python's ``float()`` reads as infinite (``inf``, ``Infinity``) normalises to ``None``.

FeTaQA — ROUGE-L recall
    From the ``rouge-score`` package (LCS-based recall of the reference tokens).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from atp_jax.tables.normalize import normalize_wtq

__all__ = [
    "TATQA_SCALES",
    "DateValue",
    "NumberValue",
    "StringValue",
    "Value",
    "approximate_canon",
    "check_denotation",
    "normalize_wtq",
    "parse_wtq_date",
    "parse_wtq_number",
    "rouge_l_recall",
    "tatqa_answer_string",
    "tatqa_em_f1",
    "tatqa_is_number",
    "tatqa_normalize_answer",
    "tatqa_prediction_input",
    "tatqa_to_number",
    "to_value",
    "to_value_list",
    "wtq_accuracy",
    "wtq_prediction_items",
]


# ---------------------------------------------------------------------------- WTQ


@dataclass(frozen=True, eq=False)
class StringValue:
    """A string answer; equal to another string value with the same normalised text."""

    normalized: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StringValue) and self.normalized == other.normalized

    def __hash__(self) -> int:
        return hash(("s", self.normalized))

    def match(self, other: Value) -> bool:
        """True when the normalised strings are equal."""
        return self.normalized == other.normalized


@dataclass(frozen=True, eq=False)
class NumberValue:
    """A numeric answer; an amount within 1e-6 of an integer is truncated to an ``int`` (6.9999999 -> 6)."""

    amount: int | float
    normalized: str

    def __post_init__(self) -> None:
        # int() truncates toward zero, as the official evaluator does; round() would turn 6.9999999 into 7.
        near_integer = abs(self.amount - round(self.amount)) < 1e-6
        object.__setattr__(self, "amount", int(self.amount) if near_integer else float(self.amount))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NumberValue) and self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def match(self, other: Value) -> bool:
        """True for equal normalised strings or another number within 1e-6."""
        if self.normalized == other.normalized:
            return True
        return isinstance(other, NumberValue) and abs(self.amount - other.amount) < 1e-6


@dataclass(frozen=True, eq=False)
class DateValue:
    """A date ``yyyy-mm-dd`` where any part may be unknown (``-1``, written ``xx``)."""

    year: int
    month: int
    day: int
    normalized: str

    @property
    def ymd(self) -> tuple[int, int, int]:
        return (self.year, self.month, self.day)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DateValue) and self.ymd == other.ymd

    def __hash__(self) -> int:
        return hash(("d", self.ymd))

    def match(self, other: Value) -> bool:
        """True for equal normalised strings or another date with the same parts."""
        if self.normalized == other.normalized:
            return True
        return isinstance(other, DateValue) and self.ymd == other.ymd


Value = StringValue | NumberValue | DateValue


def _python2_int(text: str) -> int | None:
    # Python 3's int() also takes "1_000"; Python 2's, which the official evaluator was written for, did not.
    if "_" in text:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_wtq_number(text: str) -> int | float | None:
    """The number ``text`` reads as for the official evaluator (``int()``, else a finite ``float()``), or None.

    Python's readers take surrounding whitespace, a sign, leading zeros, an exponent and any Unicode decimal
    digits; they reject thousands separators, units and ``_``.
    """
    if "_" in text:
        return None
    amount = _python2_int(text)
    if amount is not None:
        return amount
    try:
        amount = float(text)
    except ValueError:
        return None
    return amount if math.isfinite(amount) else None


def parse_wtq_date(text: str) -> tuple[int, int, int] | None:
    """``(year, month, day)`` of a canonical date ``yyyy-mm-dd``, -1 for a part written ``xx``; else None.

    Each part is read with ``int()`` (so ``"+2001- 3 -04"`` is a date); the month must be 1..12 and the day
    1..31 when known, and at least one part must be known.
    """
    parts = text.lower().split("-")
    if len(parts) != 3:
        return None
    year_s, month_s, day_s = parts
    year = -1 if year_s in ("xx", "xxxx") else _python2_int(year_s)
    month = -1 if month_s == "xx" else _python2_int(month_s)
    day = -1 if day_s == "xx" else _python2_int(day_s)
    if year is None or month is None or day is None or year == month == day == -1:
        return None
    if not (month == -1 or 1 <= month <= 12) or not (day == -1 or 1 <= day <= 31):
        return None
    return (year, month, day)


_GROUPED_NUMBER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def approximate_canon(answer: str) -> str | None:
    """A stand-in for the CoreNLP canonical value of a *gold* answer, for data that lacks ``targetCanon``.

    A number with comma thousands separators (``"12,467"``, ``"-1,000.5"``) gives the number without them;
    anything else gives None (typed by its own text). Never apply it to predictions: the official evaluator
    reads ``"12,467"`` as a string when predicted.
    """
    stripped = answer.strip()
    if _GROUPED_NUMBER.fullmatch(stripped):
        return stripped.replace(",", "")
    return None


def to_value(original: str | Value, canonical: str | None = None) -> Value:
    """Turn an answer string into a value, following the official ``to_value``.

    The type comes from ``canonical`` (the CoreNLP value of a gold item) when it is non-empty, else from
    ``original``: a number (:func:`parse_wtq_number`) gives :class:`NumberValue`; a date
    (:func:`parse_wtq_date`) gives :class:`DateValue`, or the :class:`NumberValue` of the year when only the
    year is known (``"1990-xx-xx"``); anything else :class:`StringValue`. The normalised text always comes
    from ``original``.
    """
    if isinstance(original, (StringValue, NumberValue, DateValue)):
        return original
    if not isinstance(original, str):
        raise TypeError(f"answers must be str, got {type(original).__name__} {original!r}")
    if canonical is not None and not isinstance(canonical, str):
        raise TypeError(f"canonical values must be str, got {type(canonical).__name__} {canonical!r}")
    typed_by = canonical or original
    amount = parse_wtq_number(typed_by)
    if amount is not None:
        value = NumberValue(amount, "")
        # An empty original (only with a canonical value) is named by the amount, as officially.
        return NumberValue(value.amount, normalize_wtq(original) if original else str(value.amount))
    ymd = parse_wtq_date(typed_by)
    if ymd is not None:
        year, month, day = ymd
        if month == day == -1:
            return NumberValue(year, normalize_wtq(original) if original else str(year))
        # The official name of an unnamed date writes an unknown day as -1, not xx (it compares it to '-1').
        name = (
            normalize_wtq(original)
            if original
            else "{}-{}-{}".format(year if year != -1 else "xx", month if month != -1 else "xx", day)
        )
        return DateValue(year, month, day, name)
    return StringValue(normalize_wtq(original))


def to_value_list(originals: Sequence[str], canonicals: Sequence[str | None] | None = None) -> list[Value]:
    """Convert answer strings (with their canonical values, if any) to values and drop duplicates."""
    if isinstance(originals, str):
        raise TypeError("to_value_list expects a list of strings, not a single string")
    if canonicals is None:
        values = [to_value(x) for x in originals]
    else:
        if isinstance(canonicals, str) or len(canonicals) != len(originals):
            raise ValueError(
                f"{len(originals)} answers {list(originals)!r} need as many canonical values, got {canonicals!r}"
            )
        values = [to_value(x, c) for x, c in zip(originals, canonicals)]
    # dict.fromkeys de-duplicates like the official set() but keeps a deterministic order.
    return list(dict.fromkeys(values))


def check_denotation(target_values: Sequence[Value], predicted_values: Sequence[Value]) -> bool:
    """True when both lists have the same size and each target matches some prediction."""
    if len(target_values) != len(predicted_values):
        return False
    return all(any(t.match(p) for p in predicted_values) for t in target_values)


def wtq_prediction_items(prediction: str) -> list[str]:
    """The official evaluator's item list for a free-text answer: split on ``|``, each item stripped.

    A blank prediction gives ``[]``; a trailing ``|`` gives a last empty item. Commas, semicolons, "and" and
    line breaks do not separate answers.
    """
    if not prediction.strip():
        return []
    return [item.strip() for item in prediction.split("|")]


def wtq_accuracy(
    prediction: str | Sequence[str],
    answers: Sequence[str],
    target_canon: Sequence[str] | None = None,
) -> float:
    """WTQ denotation accuracy (1.0 or 0.0) of one prediction.

    Args:
        prediction: free text (split with :func:`wtq_prediction_items`) or an already split list of items.
        answers: the gold answers (``targetValue`` split on ``|``).
        target_canon: the CoreNLP canonical value of each gold answer (``targetCanon``); when None, gold is
            typed by its own text with :func:`approximate_canon` (see the module docstring).
    """
    if isinstance(answers, str):
        raise TypeError("answers must be a list of strings; wrap a single answer as [answer]")
    items = wtq_prediction_items(prediction) if isinstance(prediction, str) else list(prediction)
    canonicals = [approximate_canon(a) for a in answers] if target_canon is None else target_canon
    ok = check_denotation(to_value_list(list(answers), canonicals), to_value_list(items))
    return 1.0 if ok else 0.0


# ---------------------------------------------------------------------------- TAT-QA

TATQA_SCALES: tuple[str, ...] = ("", "thousand", "million", "billion", "percent")

# Characters ignored when reading a number ("$1,234" -> 1234, "(12)" -> 12, "5%" -> 5).
_TATQA_NUM_EXCLUDE = set("'\"\\$€£¥%(),[]")
_TATQA_NUMBER = re.compile(r"([+-]?\d+(\.\d+)?)|([+-]?\.\d+)")
_TATQA_WORD_SCALE = re.compile(r"[\d.]+\s?[a-zA-Z]+")
_TATQA_NEGATIVE = re.compile(r"\([\d.\s]+\)")
_TATQA_PERCENT = re.compile(r"[\d.\s]+%")
_TATQA_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)
# The official scale_to_num: the first of these found as a substring wins ("thousands" is a thousand).
_TATQA_SCALE_WORDS = (
    ("hundred", 100),
    ("thousand", 1000),
    ("million", 1_000_000),
    ("billion", 1_000_000_000),
    ("percent", 0.01),
)


def _tatqa_scale_factor(scale: str) -> int | float:
    # Ints for the word scales, so that integer answers stay ints ("-134", not "-134.0").
    scale = scale.lower()
    for word, factor in _TATQA_SCALE_WORDS:
        if word in scale:
            return factor
    return 1


def _tatqa_clean_number(text: str) -> str:
    return "".join(ch for ch in text if ch not in _TATQA_NUM_EXCLUDE)


def tatqa_prediction_input(prediction: str) -> str | list[str]:
    """What the official metric receives for a free-text answer: the ``|``-split, stripped items when the text
    contains ``|``, otherwise the text itself."""
    if "|" in prediction:
        return [item.strip() for item in prediction.split("|")]
    return prediction


def tatqa_is_number(text: str) -> bool:
    """True when ``text`` reads as a number, optionally followed by a scale word (official ``is_number``).

    The first whitespace-separated word, after removing currency signs, commas, quotes, brackets and ``%``,
    must be read by Python's ``float()`` as anything but NaN (so ``inf`` counts); a second word, if any, must
    hold a scale word ("1.5 million" is a number, "2019 and 2018" is not).
    """
    words = " ".join(_tatqa_clean_number(w) for w in text.split()).split()
    if not words:
        return False
    try:
        value = float(words[0])
    except ValueError:
        return False
    if math.isnan(value):
        return False
    return not (len(words) >= 2 and _tatqa_scale_factor(words[1]) == 1)


def tatqa_to_number(text: str) -> int | float | None:
    """The first number in ``text`` with its scale word, sign and percent sign (official ``to_number``).

    "(134)" -> -134 (accounting negative), "5%" -> 0.05, "1.5 million" -> 1500000.0, "$1,234" -> 1234; the
    scale is the first scale word right after a digit anywhere in the text. Rounded to 4 decimals. None when
    there is no number, or the first one is written without a leading digit (".5").
    """
    match = _TATQA_NUMBER.search(_tatqa_clean_number(text))
    if match is None or match.group(1) is None:
        return None
    literal = match.group(1)
    number: int | float = float(literal) if "." in literal else int(literal)
    word = _TATQA_WORD_SCALE.search(text)
    scale = _tatqa_scale_factor(word.group(0)) if word else 1
    sign = -1 if _TATQA_NEGATIVE.search(text.strip()) else 1
    percent = 0.01 if _TATQA_PERCENT.search(text.strip()) else 1
    return round(number * scale * sign * percent, 4)


def tatqa_normalize_answer(text: str) -> str:
    """Normalise an answer token by token (tokens split on single spaces): lower case, strip punctuation from
    a token that is not a number, write a number as ``str(tatqa_to_number(token))``, drop articles, collapse
    whitespace."""
    parts = []
    for token in text.split(" "):
        token = token.lower()
        if not tatqa_is_number(token):
            token = "".join(ch for ch in token if ch not in _PUNCTUATION)
        if tatqa_is_number(token):
            token = str(tatqa_to_number(token))
        token = " ".join(_TATQA_ARTICLES.sub(" ", token).split())
        if token.strip():
            parts.append(token)
    return " ".join(parts).strip()


def tatqa_answer_string(answers: Sequence[str], scale: str) -> str:
    """Answers rendered as one string (official ``get_answer_str``): sorted, each number as ``"%.4f"`` with
    the scale applied (to the number rounded to 2 decimals unless it carries ``%``), each other item followed
    by the scale word, joined by spaces."""
    rendered = []
    for answer in sorted(answers):
        number = tatqa_to_number(answer) if tatqa_is_number(answer) else None
        if number is None:
            rendered.append(f"{answer} {scale}" if scale else answer)
        elif "%" in answer:  # The answer carries its own percent sign.
            rendered.append(f"{number:.4f}")
        else:
            rendered.append(f"{round(number, 2) * _tatqa_scale_factor(scale):.4f}")
    return " ".join(rendered)


def _bag_f1(predicted: set[str], gold: set[str]) -> float:
    overlap = len(predicted & gold)
    precision = overlap / len(predicted) if predicted else 1.0
    recall = overlap / len(gold) if gold else 1.0
    if precision == 0.0 and recall == 0.0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def _tatqa_em_f1_strings(predicted: str, gold: str) -> tuple[float, float]:
    """EM and bag-of-words F1 of two rendered answer strings (one bag each, so no alignment is needed)."""
    predicted_norm = tatqa_normalize_answer(predicted)
    gold_norm = tatqa_normalize_answer(gold)
    em = 1.0 if predicted_norm == gold_norm else 0.0
    f1 = _bag_f1(set(predicted_norm.split()), set(gold_norm.split()))
    # numpy's rounding, which the official round() of a numpy mean uses (it differs from Python's at ties).
    return em, float(np.round(np.float64(f1), 2))


def tatqa_em_f1(
    prediction: str | Sequence[str],
    answers: Sequence[str],
    scale: str = "",
    answer_type: str = "",
    pred_scale: str = "",
) -> tuple[float, float]:
    """TAT-QA exact match and F1 of one prediction.

    Args:
        prediction: the model's answer. Free text is passed on as :func:`tatqa_prediction_input` gives it and
            may carry its own scale ("1.2 million", "12.5%"); a list is used as the items.
        answers: the gold answers (strings, as in the dataset).
        scale: the gold scale, one of :data:`TATQA_SCALES`.
        answer_type: ``span``, ``multi-span``, ``arithmetic`` or ``count``; for the last two, F1 equals EM.
        pred_scale: the predicted scale, for a model that outputs the scale separately from a bare number.
            Leave it ``""`` when the scale is written in the text, or the text's scale is applied twice.

    Returns:
        ``(em, f1)``, each in [0, 1].
    """
    if scale not in TATQA_SCALES:
        raise ValueError(f"unknown TAT-QA scale {scale!r}; expected one of {TATQA_SCALES}")
    if pred_scale not in TATQA_SCALES:
        raise ValueError(f"unknown pred_scale {pred_scale!r}; expected one of {TATQA_SCALES}")
    if isinstance(answers, str):
        raise TypeError("answers must be a list of strings; wrap a single answer as [answer]")
    official_input = tatqa_prediction_input(prediction) if isinstance(prediction, str) else list(prediction)
    if not official_input or not answers:
        return 0.0, 0.0
    items = [official_input] if isinstance(official_input, str) else [str(p) for p in official_input]

    gold_string = tatqa_answer_string(list(answers), scale)
    predicted_strings = [tatqa_answer_string(items, pred_scale)]
    # A bare number may be the fraction behind a percent answer (0.2342 for 23.42%): also try it without the
    # 2-decimal rounding, as the official add_percent_pred does.
    if len(items) == 1 and not pred_scale and "%" not in items[0] and tatqa_is_number(items[0]):
        number = tatqa_to_number(items[0])
        if number is not None:
            predicted_strings.append(f"{number:.4f}")

    em, f1 = max(_tatqa_em_f1_strings(p, gold_string) for p in predicted_strings)
    if answer_type in ("arithmetic", "count"):
        f1 = em
    return em, f1


# ---------------------------------------------------------------------------- FeTaQA


@lru_cache(maxsize=2)
def _rouge_scorer(use_stemmer: bool):
    from rouge_score import rouge_scorer  # Imported lazily: it pulls in nltk.

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=use_stemmer)


def rouge_l_recall(prediction: str, answers: Sequence[str], use_stemmer: bool = True) -> float:
    """ROUGE-L recall of ``prediction`` against the best-matching reference answer.

    Recall is the length of the longest common token subsequence divided by the
    reference's token count (``rouge-score`` tokenisation: lower case, alphanumeric
    tokens). Porter stemming is on by default, as in the usual ROUGE setup.
    """
    if isinstance(answers, str):
        raise TypeError("answers must be a list of strings; wrap a single answer as [answer]")
    if not answers:
        raise ValueError("rouge_l_recall needs at least one reference answer")
    scorer = _rouge_scorer(use_stemmer)
    return max(scorer.score(reference, prediction)["rougeL"].recall for reference in answers)
