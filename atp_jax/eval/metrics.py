"""Answer metrics for WikiTableQuestions, TAT-QA and FeTaQA.

WTQ — denotation accuracy
    Follows the rules of the official evaluator (ppasupat/WikiTableQuestions,
    ``evaluator.py``): strings are normalised (:func:`normalize_wtq`), turned into
    string, number or date values (:func:`to_value`), de-duplicated, and a prediction is
    correct when it has as many distinct values as the gold answer and every gold value
    matches some predicted value (:func:`check_denotation`). A value matches another
    when their normalised strings are equal, or both are numbers within 1e-6, or both
    are dates with the same (year, month, day).

    One difference, made on purpose: the official evaluator reads *canonical* gold
    values from CoreNLP-tagged files (so gold "1,000" is the number 1000), and uses
    predictions as written. Our gold answers come without those tags, and LLMs write
    thousands separators freely, so :func:`wtq_canonical` (strip the commas of a
    properly grouped number such as "12,467") is applied to gold *and* predicted
    strings. Everything else (dates in words, units) is left as a string, as the
    official evaluator does for predictions.

TAT-QA — exact match and F1
    Follows the official ``tatqa_metric.py``/``tatqa_utils.py`` (NExTplusplus/TAT-QA):
    numeric answers are rendered as ``"%.4f"`` after applying the scale (thousand,
    million, billion, percent), the text is normalised (lower case, punctuation and
    articles removed, numbers canonicalised), EM is equality of the normalised
    answers, F1 is the bag-of-words F1 after an optimal one-to-one alignment, rounded to
    2 decimals, and for ``arithmetic``/``count`` questions F1 is set equal to EM.

FeTaQA — ROUGE-L recall
    From the ``rouge-score`` package (LCS-based recall of the reference tokens).
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = [
    "StringValue",
    "NumberValue",
    "DateValue",
    "Value",
    "normalize_wtq",
    "wtq_canonical",
    "to_value",
    "to_value_list",
    "check_denotation",
    "split_prediction",
    "wtq_accuracy",
    "TATQA_SCALES",
    "tatqa_normalize_answer",
    "tatqa_to_number",
    "tatqa_is_number",
    "tatqa_em_f1",
    "rouge_l_recall",
    "score",
]


# ---------------------------------------------------------------------------- WTQ

_QUOTES_SINGLE = re.compile(r"[\u2018\u2019\u00b4`]")  # ‘ ’ ´ `
_QUOTES_DOUBLE = re.compile(r"[\u201c\u201d]")  # “ ”
_DASHES = re.compile(r"[\u2010\u2011\u2012\u2013\u2014\u2212]")  # ‐ ‑ ‒ – — −
# A trailing citation/footnote mark: "[1]", "[note 2]" (not at the very start), or a
# trailing bullet, dagger, asterisk, hash or plus sign.
_TRAILING_CITATIONS = re.compile(r"((?<!^)\[[^\]]*\]|\[\d+\]|[\u2022\u2666\u2020\u2021*#+])*$")
# Trailing parenthesised details such as "Paris (France)" (not a string that is all parens).
_TRAILING_PARENS = re.compile(r"(?<!^)( \([^)]*\))*$")
_OUTER_QUOTES = re.compile(r'^"([^"]*)"$')


def normalize_wtq(text: str) -> str:
    """Normalise a WTQ answer string the way the official evaluator does.

    Steps, in order: Unicode NFKD with combining marks removed (so "é" -> "e"); curly
    quotes, acute accents and backticks -> ``'``/``"``; Unicode dashes -> ``-``; then
    repeatedly strip trailing citations/footnote marks, trailing `` (parenthesised
    details)``, and one pair of outer double quotes until nothing changes; drop one
    final ``.``; collapse whitespace; lower-case.
    """
    text = "".join(
        ch for ch in unicodedata.normalize("NFKD", text) if unicodedata.category(ch) != "Mn"
    )
    text = _QUOTES_SINGLE.sub("'", text)
    text = _QUOTES_DOUBLE.sub('"', text)
    text = _DASHES.sub("-", text)
    while True:
        previous = text
        text = _TRAILING_CITATIONS.sub("", text.strip())
        text = _TRAILING_PARENS.sub("", text.strip())
        text = _OUTER_QUOTES.sub(r"\1", text.strip())
        if text == previous:
            break
    if text.endswith("."):
        text = text[:-1]
    return re.sub(r"\s+", " ", text).lower().strip()


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
    """A numeric answer; values within 1e-6 of an integer are stored as ``int``."""

    amount: int | float
    normalized: str

    def __post_init__(self) -> None:
        if abs(self.amount - round(self.amount)) < 1e-6:
            object.__setattr__(self, "amount", int(round(self.amount)))

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

# What Python 2's int()/float() accepted (the official evaluator is Python 2 code):
# optional sign, digits with an optional fraction, optional exponent. No underscores,
# no "inf"/"nan", no thousands separators.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_GROUPED_NUMBER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DATE = re.compile(r"(\d+|xx|xxxx)-(\d+|xx)-(\d+|xx)")


def _parse_number(text: str) -> int | float | None:
    text = text.strip()
    if _INTEGER.fullmatch(text):
        return int(text)
    if _NUMBER.fullmatch(text):
        amount = float(text)
        return amount if math.isfinite(amount) else None
    return None


def _parse_date(text: str) -> tuple[int, int, int] | None:
    match = _DATE.fullmatch(text.strip().lower())
    if match is None:
        return None
    year_s, month_s, day_s = match.groups()
    year = -1 if year_s in ("xx", "xxxx") else int(year_s)
    month = -1 if month_s == "xx" else int(month_s)
    day = -1 if day_s == "xx" else int(day_s)
    if year == month == day == -1:
        return None
    if not (month == -1 or 1 <= month <= 12) or not (day == -1 or 1 <= day <= 31):
        return None
    return (year, month, day)


def wtq_canonical(text: str) -> str:
    """Our stand-in for the CoreNLP canonical value: drop thousands separators.

    ``"12,467"`` -> ``"12467"``, ``"-1,000.5"`` -> ``"-1000.5"``. Anything that is not a
    properly grouped number (``"1,2"``, ``"Paris, France"``) is returned unchanged.
    """
    stripped = text.strip()
    if _GROUPED_NUMBER.fullmatch(stripped):
        return stripped.replace(",", "")
    return text


def to_value(original: str | Value, canonical: str | None = None) -> Value:
    """Turn an answer string into a value, following the official ``to_value``.

    ``canonical`` (the official evaluator's CoreNLP value) decides the type: a number
    gives :class:`NumberValue`; ``yyyy-mm-dd`` with ``xx`` for unknown parts gives
    :class:`DateValue`, or a :class:`NumberValue` of the year when only the year is
    known (``"1990-xx-xx"`` is the number 1990); anything else gives
    :class:`StringValue`. The value's normalised text always comes from ``original``.
    When ``canonical`` is ``None``, :func:`wtq_canonical` of ``original`` is used.
    """
    if isinstance(original, (StringValue, NumberValue, DateValue)):
        return original
    if not isinstance(original, str):
        raise TypeError(f"answers must be str, got {type(original).__name__} {original!r}")
    if not canonical:
        canonical = wtq_canonical(original)
    normalized = normalize_wtq(original)
    amount = _parse_number(canonical)
    if amount is not None:
        return NumberValue(amount, normalized)
    ymd = _parse_date(canonical)
    if ymd is not None:
        year, month, day = ymd
        if month == day == -1:
            return NumberValue(year, normalized)
        return DateValue(year, month, day, normalized)
    return StringValue(normalized)


def to_value_list(
    originals: Sequence[str], canonicals: Sequence[str | None] | None = None
) -> list[Value]:
    """Convert answer strings to values and drop duplicates (as the official code does)."""
    if isinstance(originals, str):
        raise TypeError("to_value_list expects a list of strings, not a single string")
    if canonicals is None:
        values = [to_value(x) for x in originals]
    else:
        if len(canonicals) != len(originals):
            raise ValueError(
                f"{len(originals)} answers but {len(canonicals)} canonical values"
            )
        values = [to_value(x, c) for x, c in zip(originals, canonicals)]
    # dict.fromkeys de-duplicates like set() but keeps a deterministic order.
    return list(dict.fromkeys(values))


def check_denotation(target_values: Sequence[Value], predicted_values: Sequence[Value]) -> bool:
    """True when both lists have the same size and each target matches some prediction."""
    if len(target_values) != len(predicted_values):
        return False
    return all(any(t.match(p) for p in predicted_values) for t in target_values)


_AND_PREFIX = re.compile(r"^and\s+", re.IGNORECASE)


def split_prediction(prediction: str, n_answers: int) -> list[str]:
    """Split a model's free-text answer into answer items.

    Rules, applied in order:

    1. Surrounding whitespace is stripped; an empty prediction gives ``[]``.
    2. If the text contains ``|`` (WTQ's own list separator) it is split on ``|``,
       whatever ``n_answers`` is.
    3. Otherwise, a single expected answer (``n_answers <= 1``) keeps the text whole:
       "Paris, France" stays one answer.
    4. Otherwise (several expected answers) it is split on ``;`` when present, else on
       a comma followed by whitespace (so "1,000" is not split); a leading "and " of an
       item is dropped ("a, b, and c"). If that still gives one item, " and " is tried,
       but only when it yields exactly ``n_answers`` items ("Alice and Bob" for two
       answers; "Trinidad and Tobago" stays whole when three are expected).

    Items are stripped and empty items dropped.
    """
    text = prediction.strip()
    if not text:
        return []
    if "|" in text:
        items = text.split("|")
    elif n_answers <= 1:
        items = [text]
    else:
        items = re.split(r";", text) if ";" in text else re.split(r",\s+", text)
        items = [_AND_PREFIX.sub("", item.strip()) for item in items]
        if len([item for item in items if item]) == 1:
            parts = re.split(r"\s+and\s+", text, flags=re.IGNORECASE)
            if len(parts) == n_answers:
                items = parts
    return [item.strip() for item in items if item.strip()]


def wtq_accuracy(prediction: str | Sequence[str], answers: Sequence[str]) -> float:
    """WTQ denotation accuracy (1.0 or 0.0) of one prediction.

    Args:
        prediction: free text (split with :func:`split_prediction` using the number of
            gold answers) or an already split list of answer items.
        answers: the gold answers.
    """
    if isinstance(answers, str):
        raise TypeError("answers must be a list of strings; wrap a single answer as [answer]")
    if isinstance(prediction, str):
        items = split_prediction(prediction, len(answers))
    else:
        items = list(prediction)
    ok = check_denotation(to_value_list(list(answers)), to_value_list(items))
    return 1.0 if ok else 0.0


# ---------------------------------------------------------------------------- TAT-QA

TATQA_SCALES: tuple[str, ...] = ("", "thousand", "million", "billion", "percent")

# Characters ignored when reading a number ("$1,234" -> 1234, "(12)" -> 12, "5%" -> 5).
_TATQA_NUM_EXCLUDE = set("'\"\\$€£¥%(),[]")
_TATQA_FIRST_NUMBER = re.compile(r"([+-]?\d+(\.\d+)?)|([+-]?\.\d+)")
_TATQA_WORD_SCALE = re.compile(r"[\d.]+\s?[a-zA-Z]+")
_TATQA_NEGATIVE = re.compile(r"\([\d.\s]+\)")
_TATQA_PERCENT = re.compile(r"[\d.\s]+%")
_TATQA_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def _tatqa_scale_factor(scale: str) -> int | float:
    # Ints for the word scales (so integer answers stay ints, e.g. "-134" not "-134.0"),
    # matching the official scale_to_num. The first scale word found wins.
    scale = scale.lower()
    for word, factor in (("hundred", 100), ("thousand", 1000), ("million", 1_000_000),
                         ("billion", 1_000_000_000), ("percent", 0.01)):
        if word in scale:
            return factor
    return 1


def _tatqa_clean_number(text: str) -> str:
    return "".join(ch for ch in text if ch not in _TATQA_NUM_EXCLUDE)


def tatqa_is_number(text: str) -> bool:
    """True when ``text`` reads as a number, optionally followed by a scale word.

    The first whitespace-separated word, after removing currency signs, commas, quotes,
    brackets and ``%``, must parse as a finite float; a second word, if any, must be a
    scale word ("1.5 million" is a number, "2019 and 2018" is not).
    """
    words = " ".join(_tatqa_clean_number(w) for w in text.split()).split()
    if not words:
        return False
    try:
        value = float(words[0])
    except ValueError:
        return False
    if not math.isfinite(value):
        return False
    return not (len(words) >= 2 and _tatqa_scale_factor(words[1]) == 1)


def tatqa_to_number(text: str) -> int | float | None:
    """Read the first number in ``text`` with its sign, scale word and percent sign.

    "(134)" -> -134 (accounting negative), "5%" -> 0.05, "1.5 million" -> 1500000.0,
    "$1,234" -> 1234. Rounded to 4 decimals. ``None`` when there is no number.
    """
    cleaned = _tatqa_clean_number(text)
    match = _TATQA_FIRST_NUMBER.search(cleaned)
    # A bare ".5" has no group 1; the official reader returns no number for it.
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
    """Normalise an answer token by token: lower case, strip punctuation (except from
    numbers), canonicalise numbers, drop articles, collapse whitespace."""
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


def _tatqa_answer_string(answers: Sequence[str], scale: str) -> str:
    """Render answers as one string: numbers as '%.4f' with the scale applied."""
    rendered = []
    for answer in sorted(answers):
        if tatqa_is_number(answer) and (number := tatqa_to_number(answer)) is not None:
            if "%" in answer:  # The answer carries its own percent sign.
                rendered.append("%.4f" % number)
            else:
                rendered.append("%.4f" % (round(number, 2) * _tatqa_scale_factor(scale)))
        else:
            rendered.append(f"{answer} {scale}" if scale else answer)
    return " ".join(rendered)


def _bag_f1(predicted: set[str], gold: set[str]) -> float:
    overlap = len(predicted & gold)
    precision = overlap / len(predicted) if predicted else 1.0
    recall = overlap / len(gold) if gold else 1.0
    if precision == 0.0 and recall == 0.0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def _tatqa_em_f1_strings(predicted: str, gold: str) -> tuple[float, float]:
    """EM and aligned bag-of-words F1 between two answer strings."""
    predicted_norm = [tatqa_normalize_answer(predicted)]
    gold_norm = [tatqa_normalize_answer(gold)]
    same = set(predicted_norm) == set(gold_norm) and len(predicted_norm) == len(gold_norm)
    em = 1.0 if same else 0.0
    predicted_bags = [set(s.split()) for s in predicted_norm]
    gold_bags = [set(s.split()) for s in gold_norm]
    scores = np.array([[_bag_f1(p, g) for p in predicted_bags] for g in gold_bags])
    rows, cols = linear_sum_assignment(-scores)
    best = np.zeros(max(len(gold_bags), len(predicted_bags)))
    for r, c in zip(rows, cols):
        best[r] = max(best[r], scores[r, c])
    return em, round(float(np.mean(best)), 2)


def tatqa_em_f1(
    prediction: str | Sequence[str],
    answers: Sequence[str],
    scale: str = "",
    answer_type: str = "",
    pred_scale: str = "",
) -> tuple[float, float]:
    """TAT-QA exact match and F1 of one prediction.

    Args:
        prediction: the model's answer. Free text may carry its own scale ("1.2 million",
            "12.5%"), which the number reader applies. With several gold answers
            (multi-span) a string is split with :func:`split_prediction`; the items are
            sorted, so their order does not matter. A list is used as given.
        answers: the gold answers (strings, as in the dataset).
        scale: the gold scale, one of :data:`TATQA_SCALES`.
        answer_type: ``span``, ``multi-span``, ``arithmetic`` or ``count``; for the last
            two, F1 equals EM.
        pred_scale: the predicted scale, for a model that outputs the scale separately
            from a bare number. Leave it ``""`` when the scale is written in the text,
            or the text's scale is applied twice.

    Returns:
        ``(em, f1)``, each in [0, 1].
    """
    if scale not in TATQA_SCALES:
        raise ValueError(f"unknown TAT-QA scale {scale!r}; expected one of {TATQA_SCALES}")
    if pred_scale not in TATQA_SCALES:
        raise ValueError(f"unknown pred_scale {pred_scale!r}; expected one of {TATQA_SCALES}")
    if isinstance(answers, str):
        raise TypeError("answers must be a list of strings; wrap a single answer as [answer]")
    if isinstance(prediction, str) and len(answers) > 1:
        items = split_prediction(prediction, len(answers))
    elif isinstance(prediction, str):
        items = [prediction.strip()]
    else:
        items = [str(p) for p in prediction]
    items = [item for item in items if item]
    if not items or not answers:
        return 0.0, 0.0

    gold_strings = [_tatqa_answer_string(answers, scale)]
    predicted_strings = [_tatqa_answer_string(items, pred_scale)]
    # A bare number with no scale may already be the fraction behind a percent answer
    # (0.2342 for 23.42%): also try it unrounded, as the official add_percent_pred does.
    if len(items) == 1 and not pred_scale and "%" not in items[0] and tatqa_is_number(items[0]):
        number = tatqa_to_number(items[0])
        if number is not None:
            predicted_strings.append("%.4f" % number)

    em, f1 = max(_tatqa_em_f1_strings(p, g) for p in predicted_strings for g in gold_strings)
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


# ---------------------------------------------------------------------------- dispatch


def score(
    dataset: str,
    prediction: str,
    answers: Sequence[str],
    meta: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Score one prediction with the metric of ``dataset``.

    Args:
        dataset: ``"wtq"`` -> ``{"accuracy"}``; ``"tatqa"`` -> ``{"em", "f1"}``;
            ``"fetaqa"`` -> ``{"rougeL_recall"}``.
        prediction: the model's free-text answer.
        answers: the gold answers.
        meta: the example's metadata. TAT-QA needs ``meta["scale"]`` (and uses
            ``meta["answer_type"]`` when present); pass ``example.meta``.
    """
    name = dataset.lower()
    if name == "wtq":
        return {"accuracy": wtq_accuracy(prediction, answers)}
    if name == "tatqa":
        if meta is None or "scale" not in meta:
            raise ValueError(
                "TAT-QA scoring needs the gold scale: pass meta=example.meta, or "
                "meta={'scale': '', 'answer_type': ...} for data without one"
            )
        em, f1 = tatqa_em_f1(
            prediction, answers, scale=meta["scale"], answer_type=meta.get("answer_type", "")
        )
        return {"em": em, "f1": f1}
    if name == "fetaqa":
        return {"rougeL_recall": rouge_l_recall(prediction, answers)}
    raise ValueError(f"no metric for dataset {dataset!r}; expected 'wtq', 'tatqa' or 'fetaqa'")
