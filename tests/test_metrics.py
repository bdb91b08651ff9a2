"""Tests for atp_jax.eval.metrics.

Expected values are worked out by hand from the official rules (WikiTableQuestions
evaluator.py, TAT-QA tatqa_metric.py/tatqa_utils.py) and from the definition of ROUGE-L.
They pin rules one at a time, including some the shared scoring cases do not exercise;
test_official_verdicts.py checks the scorers against the official verdicts themselves.
"""

import pytest

from atp_jax.eval.metrics import (
    DateValue,
    NumberValue,
    StringValue,
    approximate_canon,
    check_denotation,
    normalize_wtq,
    rouge_l_recall,
    tatqa_em_f1,
    tatqa_is_number,
    tatqa_normalize_answer,
    tatqa_prediction_input,
    tatqa_to_number,
    to_value,
    to_value_list,
    wtq_accuracy,
    wtq_prediction_items,
)
from atp_jax.eval.scoring import score

# ------------------------------------------------------------------ WTQ normalisation


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("Café Müller", "cafe muller"),  # diacritics removed, lower case
        ("\u201cHello\u201d", "hello"),  # curly quotes -> '"', then outer quotes removed
        ('"Quoted"', "quoted"),
        ("rock \u2013 pop", "rock - pop"),  # en dash -> hyphen
        ("don\u2019t", "don't"),
        ("Paris (France)", "paris"),  # trailing parenthesised detail removed
        ("(1990)", "(1990)"),  # ... but not when it is the whole string
        ("Smith[1]", "smith"),  # citation removed
        ("Gold*", "gold"),  # footnote mark removed
        ("End.", "end"),  # one final period removed
        ("  many   spaces\there ", "many spaces here"),
        ("The Beatles", "the beatles"),  # articles are kept
    ],
)
def test_normalize_wtq(raw, normalized):
    assert normalize_wtq(raw) == normalized


def test_to_value_types():
    assert to_value("1000") == NumberValue(1000, "1000")
    assert isinstance(to_value("2.5"), NumberValue) and to_value("2.5").amount == 2.5
    assert to_value("2.0").amount == 2 and isinstance(to_value("2.0").amount, int)
    assert isinstance(to_value("1,000"), StringValue)  # int()/float() reject a thousands separator
    assert to_value("1,000", canonical="1000.0") == NumberValue(1000, "1,000")  # ... the canonical value decides
    assert isinstance(to_value("1_000"), StringValue)  # Python 2 rejected '_' inside numbers
    assert to_value("\uff11\uff12") == NumberValue(12, "12")  # full-width digits, as int() reads them
    assert to_value("1e3") == NumberValue(1000, "1e3") and to_value("+007") == NumberValue(7, "+007")
    assert to_value("6.9999999").amount == 6  # near-integers are truncated, not rounded
    assert to_value("7.0000001").amount == 7
    assert to_value("1990-xx-xx") == NumberValue(1990, "1990-xx-xx")  # year only -> number
    date = to_value("1990-05-xx")
    assert isinstance(date, DateValue) and date.ymd == (1990, 5, -1)
    assert isinstance(to_value("1990-13-xx"), StringValue)  # month out of range
    assert isinstance(to_value("xx-xx-xx"), StringValue)  # nothing known
    for spelled in ("+2001-3-4", " 2001 - 03 - 04 ", "2001-03-04"):  # each part read by int()
        assert to_value(spelled).ymd == (2001, 3, 4)
    assert isinstance(to_value("2001-03-04-05"), StringValue)
    assert isinstance(to_value("November 11, 1972"), StringValue)  # a date in words only via its canonical value
    assert to_value("November 11, 1972", canonical="1972-11-11").ymd == (1972, 11, 11)
    assert isinstance(to_value("nan"), StringValue) and isinstance(to_value("inf"), StringValue)
    assert to_value("x", canonical="7") == NumberValue(7, "x")  # canonical decides the type


def test_approximate_canon():
    assert approximate_canon("12,467") == "12467"
    assert approximate_canon("-1,000.5") == "-1000.5"
    assert approximate_canon("Paris, France") is None
    assert approximate_canon("1,00") is None
    assert approximate_canon("17 years") is None  # units are not guessed


def test_to_value_list_removes_duplicates():
    assert len(to_value_list(["a", "A", "a."])) == 1
    assert len(to_value_list(["2", "2.0", "2,000"])) == 2


# ------------------------------------------------------------------ WTQ denotation accuracy


@pytest.mark.parametrize(
    "prediction, answers, correct",
    [
        ("1000", ["1,000"], True),  # gold thousands separator (approximated canonical value)
        ("1,000", ["1000"], False),  # a predicted thousands separator makes a string
        ("12,467", ["12,467"], True),  # equal normalised strings
        ("2", ["2.0"], True),
        ("2.0", ["2"], True),
        ("3.0000001", ["3"], True),  # numbers within 1e-6
        ("2.9999999", ["3"], False),  # ... but truncated to 2 first
        ("3.1", ["3"], False),
        ("1990", ["1990-xx-xx"], True),  # a year-only date is the number
        ("1990-05-xx", ["1990-05-xx"], True),
        ("1990-06-xx", ["1990-05-xx"], False),
        ("wolfe tones.", ["Wolfe Tones"], True),  # case and final period
        ('"Wolfe Tones"', ["Wolfe Tones"], True),  # outer quotes
        ("Wolfe Tones (Meath)", ["Wolfe Tones"], True),  # trailing detail in parentheses
        ("Wolfe-Tones", ["Wolfe Tones"], False),  # inner punctuation is kept
        ("3 km", ["3"], False),  # a string is not a number
        ("Bob|Alice", ["Alice", "Bob"], True),  # multi-answer sets, any order
        ("Bob, Alice", ["Alice", "Bob"], False),  # only '|' separates answers
        ("Alice and Bob", ["Alice", "Bob"], False),
        ("Alice | Bob |", ["Alice", "Bob"], False),  # a trailing '|' adds an empty item
        ("|", ["Alice"], False),
        ("Alice", ["Alice", "Bob"], False),  # too few values
        ("Alice|Bob|Carol", ["Alice", "Bob"], False),  # too many values
        ("Alice|Alice", ["Alice", "Bob"], False),  # duplicates count once
        ("alice|ALICE", ["Alice"], True),
        ("", ["Alice"], False),
        ("Paris, France", ["Paris, France"], True),  # single answer: no comma split
    ],
)
def test_wtq_accuracy(prediction, answers, correct):
    assert wtq_accuracy(prediction, answers) == (1.0 if correct else 0.0)


def test_wtq_canonical_gold_values():
    # The canonical value types the gold item; the prediction is read as written.
    assert wtq_accuracy("17", ["17 years"], ["17.0"]) == 1.0
    assert wtq_accuracy("17 years", ["17 years"], ["17.0"]) == 1.0  # equal normalised strings
    assert wtq_accuracy("17", ["17 years"]) == 0.0  # without it, "17 years" is a string
    assert wtq_accuracy("1972-11-11", ["November 11, 1972"], ["1972-11-11"]) == 1.0
    assert wtq_accuracy("11/11/1972", ["November 11, 1972"], ["1972-11-11"]) == 0.0
    assert wtq_accuracy("1972", ["1972"], ["1972-xx-xx"]) == 1.0  # a year-only date is the number
    assert wtq_accuracy("x", ["x"], [""]) == 1.0  # an empty canonical value falls back to the text
    with pytest.raises(ValueError, match="need as many canonical values"):
        wtq_accuracy("x", ["x", "y"], ["x"])


def test_check_denotation_counts_and_matches():
    gold = to_value_list(["1", "2"])
    assert check_denotation(gold, to_value_list(["2", "1"]))
    assert not check_denotation(gold, to_value_list(["1"]))
    assert not check_denotation(gold, to_value_list(["1", "3"]))
    assert wtq_accuracy(["2", "1.0"], ["1", "2"]) == 1.0  # pre-split predictions


@pytest.mark.parametrize(
    "prediction, items",
    [
        ("  Alice  ", ["Alice"]),
        ("", []),
        (" \n ", []),
        ("a|b", ["a", "b"]),
        (" a | b ", ["a", "b"]),
        ("a | b |", ["a", "b", ""]),  # a trailing '|' adds an empty item
        ("|", ["", ""]),
        ("Alice, Bob", ["Alice, Bob"]),  # no other separator
        ("Alice; Bob\nCarol", ["Alice; Bob\nCarol"]),
    ],
)
def test_wtq_prediction_items(prediction, items):
    assert wtq_prediction_items(prediction) == items


def test_tatqa_prediction_input():
    assert tatqa_prediction_input(" 12.5 ") == " 12.5 "  # text without '|' is passed on as it is
    assert tatqa_prediction_input("a | b |") == ["a", "b", ""]


# ------------------------------------------------------------------ TAT-QA


def test_tatqa_number_reading():
    assert tatqa_is_number("$1,234") and tatqa_to_number("$1,234") == 1234
    assert tatqa_is_number("1.5 million") and tatqa_to_number("1.5 million") == 1_500_000
    assert tatqa_to_number("(134)") == -134  # accounting negative
    assert tatqa_to_number("12.5%") == 0.125
    assert not tatqa_is_number("2019 and 2018")
    assert not tatqa_is_number("Sensors")
    assert tatqa_to_number("no digits") is None
    assert tatqa_to_number("12 and 15") == 12  # the first number counts
    assert tatqa_to_number(".5") is None  # no digit before the point
    assert tatqa_is_number("inf") and tatqa_to_number("inf") is None  # float() reads it, the number reader not
    assert not tatqa_is_number("nan")


def test_tatqa_normalize_answer():
    assert tatqa_normalize_answer("The Automotive segment.") == "automotive segment"
    assert tatqa_normalize_answer("$5,686") == "5686"
    assert tatqa_normalize_answer("Infinity") == "None"  # str() of the missing number


@pytest.mark.parametrize(
    "prediction, answers, scale, answer_type, expected",
    [
        # Gold 5686 million is rendered 5686000000.0000; the prediction's own scale word counts.
        ("5,686 million", ["5686"], "million", "arithmetic", (1.0, 1.0)),
        ("5686000000", ["5686"], "million", "arithmetic", (1.0, 1.0)),
        ("5686", ["5686"], "million", "arithmetic", (0.0, 0.0)),  # scale missing
        ("-94 million", ["-94"], "million", "arithmetic", (1.0, 1.0)),
        ("-95 million", ["-94"], "million", "arithmetic", (0.0, 0.0)),
        ("1,234 thousand", ["1,234"], "thousand", "span", (1.0, 1.0)),
        # Percent: gold 12.5 (percent) is 0.1250; "12.5%" and the fraction 0.125 both match.
        ("12.5%", ["12.5"], "percent", "arithmetic", (1.0, 1.0)),
        ("0.125", ["12.5"], "percent", "arithmetic", (1.0, 1.0)),
        ("12.5", ["12.5"], "percent", "arithmetic", (0.0, 0.0)),
        # Gold answers are rounded to 2 decimals before scaling: 5.678 -> 5.68 million.
        ("5680000", ["5.678"], "million", "arithmetic", (1.0, 1.0)),
        # No scale: plain numbers compare as numbers.
        ("$2,000", ["2000"], "", "span", (1.0, 1.0)),
        ("2018", ["2018"], "", "span", (1.0, 1.0)),
    ],
)
def test_tatqa_scale_cases(prediction, answers, scale, answer_type, expected):
    assert tatqa_em_f1(prediction, answers, scale, answer_type) == expected


def test_tatqa_spans():
    # Partial span: bags {commercial, transportation} vs {transportation}: P=1, R=1/2, F1=2/3.
    assert tatqa_em_f1("transportation", ["Commercial transportation"], "", "span") == (0.0, 0.67)
    assert tatqa_em_f1("the automotive segment", ["Automotive segment"], "", "span") == (1.0, 1.0)
    # Multi-span: order does not matter (both sides are sorted before joining).
    assert tatqa_em_f1("Sensors | Automotive", ["Automotive", "Sensors"], "", "multi-span") == (1.0, 1.0)
    assert tatqa_em_f1(["Sensors", "Automotive"], ["Automotive", "Sensors"], "", "multi-span") == (1.0, 1.0)
    assert tatqa_em_f1("Automotive | Sensors |", ["Automotive", "Sensors"], "", "multi-span") == (1.0, 1.0)
    # Without '|' the text is one item, kept in its order: "sensors automotive" is not "automotive sensors",
    # but the bags of words are equal.
    assert tatqa_em_f1("Sensors, Automotive", ["Automotive", "Sensors"], "", "multi-span") == (0.0, 1.0)
    # One of two spans: bags {automotive} vs {automotive, sensors}: F1 = 2/3.
    assert tatqa_em_f1("Automotive", ["Automotive", "Sensors"], "", "multi-span") == (0.0, 0.67)


def test_tatqa_arithmetic_f1_equals_em():
    # Bags {automotive, segment} vs {automotive}: P=1/2, R=1, F1=2/3 for a span answer;
    # for arithmetic and count answers F1 is set to EM.
    assert tatqa_em_f1("automotive segment", ["Automotive"], "", "span") == (0.0, 0.67)
    assert tatqa_em_f1("automotive segment", ["Automotive"], "", "arithmetic") == (0.0, 0.0)
    assert tatqa_em_f1("automotive segment", ["Automotive"], "", "count") == (0.0, 0.0)


def test_tatqa_rejects_unknown_scales_and_handles_empty_predictions():
    with pytest.raises(ValueError, match="unknown TAT-QA scale"):
        tatqa_em_f1("1", ["1"], "millions")
    assert tatqa_em_f1("   ", ["1"], "") == (0.0, 0.0)


# ------------------------------------------------------------------ FeTaQA


def test_rouge_l_recall_by_hand():
    reference = "the cat sat on the mat"  # 6 tokens
    # Longest common subsequence "the cat on mat" has 4 tokens: recall 4/6.
    assert rouge_l_recall("the cat on mat", [reference]) == pytest.approx(4 / 6)
    assert rouge_l_recall("The cat sat on the mat.", [reference]) == pytest.approx(1.0)
    assert rouge_l_recall("dogs", [reference]) == 0.0
    # With several references the best one counts.
    assert rouge_l_recall("the cat", ["the cat", reference]) == pytest.approx(1.0)
    # Porter stemming (on by default) maps "cats" to "cat".
    assert rouge_l_recall("cats", ["cat"]) == 1.0
    assert rouge_l_recall("cats", ["cat"], use_stemmer=False) == 0.0


# ------------------------------------------------------------------ dispatcher


def test_score_dispatch():
    assert score("wtq", "1000", ["1,000"]) == {"accuracy": 1.0}
    assert score("wtq", "17", ["17 years"], {"target_canon": ["17.0"]}) == {"accuracy": 1.0}
    assert score("wtq", "17", ["17 years"], {"table_id": "t"}) == {"accuracy": 0.0}
    assert score("WTQ", "no", ["1000"]) == {"accuracy": 0.0}
    assert score("tatqa", "5686 million", ["5686"], {"scale": "million", "answer_type": "arithmetic"}) == {
        "em": 1.0,
        "f1": 1.0,
    }
    result = score("fetaqa", "the cat on mat", ["the cat sat on the mat"])
    assert result == {"rougeL_recall": pytest.approx(4 / 6)}


def test_score_errors():
    with pytest.raises(ValueError, match="needs meta keys scale"):
        score("tatqa", "1", ["1"])
    with pytest.raises(ValueError, match="dataset .squad. is not registered"):
        score("squad", "1", ["1"])
    with pytest.raises(TypeError, match="wrap a single answer"):
        wtq_accuracy("a", "a")
    with pytest.raises(ValueError, match="one canonical value per answer"):
        score("wtq", "a", ["a", "b"], {"target_canon": ["a"]})
