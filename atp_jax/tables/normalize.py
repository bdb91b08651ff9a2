"""Answer text normalisation of the official WTQ evaluator, below the metrics so that defenses and
diagnostics can compare answers the way the metric does."""

from __future__ import annotations

import re
import unicodedata

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
    text = "".join(ch for ch in unicodedata.normalize("NFKD", text) if unicodedata.category(ch) != "Mn")
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
    text = text.removesuffix(".")
    return re.sub(r"\s+", " ", text).lower().strip()
