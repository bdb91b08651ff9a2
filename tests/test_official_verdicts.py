"""The WTQ and TAT-QA scorers against the official evaluators' verdicts on the shared scoring cases.

Each case is a (prediction, gold, verdict) triple whose verdict comes from the official evaluator run unchanged
(``scoring_cases/README.md`` says how); the project's scorer must give the same verdict on every one. A failure
lists the disagreeing cases by category.
"""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from atp_jax.eval.metrics import approximate_canon, parse_wtq_number
from atp_jax.eval.scoring import Scorer, score
from atp_jax.tables.table import Example, Table

_TABLE = Table(["column"], [["cell"]])  # The scorers never look at the table.


def _cases(shared_data: Path, name: str) -> list[dict]:
    path = shared_data / "scoring_cases" / f"{name}_dev.jsonl"
    if not path.is_file():
        pytest.skip(f"{path.name} not in the shared data")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _report(disagreements: dict[str, list[str]], total: int) -> str:
    lines = [f"{sum(map(len, disagreements.values()))} of {total} cases disagree with the official verdict:"]
    for category, cases in sorted(disagreements.items()):
        lines.append(f"  {category} ({len(cases)}):")
        lines.extend(f"    {case}" for case in cases[:5])
    return "\n".join(lines)


def test_wtq_accuracy_matches_the_official_evaluator(shared_data):
    cases = _cases(shared_data, "wtq")
    scorer = Scorer()
    disagreements = defaultdict(list)
    for case in cases:
        example = Example(
            "q", _TABLE, case["gold"], case["id"], meta={"target_canon": case["gold_canon"]}, dataset="wtq"
        )
        (scores,) = scorer(example, [case["prediction"]])
        if (scores["accuracy"] == 1.0) != case["official"]["correct"]:
            disagreements[case["category"]].append(
                f"{case['id']}: prediction {case['prediction']!r}, gold {case['gold']!r} "
                f"(canonical {case['gold_canon']!r}): official {case['official']['correct']}, "
                f"ours {scores['accuracy']}"
            )
    assert not disagreements, _report(disagreements, len(cases))


def test_tatqa_em_f1_match_the_official_metric(shared_data):
    cases = _cases(shared_data, "tatqa")
    scorer = Scorer()
    disagreements = defaultdict(list)
    for case in cases:
        example = Example(
            "q",
            _TABLE,
            case["gold"],
            case["id"],
            dataset="tatqa",
            meta={"scale": case["scale"], "answer_type": case["answer_type"]},
        )
        (scores,) = scorer(example, [case["prediction"]])
        official = case["official"]
        if (scores["em"], scores["f1"]) != (official["em"], official["f1"]):
            disagreements[case["category"]].append(
                f"{case['id']}: prediction {case['prediction']!r}, gold {case['gold']!r} ({case['scale']!r}, "
                f"{case['answer_type']}): official em/f1 {official['em']}/{official['f1']}, "
                f"ours {scores['em']}/{scores['f1']}"
            )
    assert not disagreements, _report(disagreements, len(cases))


def test_gold_approximation_agrees_with_corenlp(shared_data):
    """Where the stand-in for CoreNLP gives a gold item a number, CoreNLP gave it the same number."""
    pairs = {(g, c) for case in _cases(shared_data, "wtq") for g, c in zip(case["gold"], case["gold_canon"])}
    approximated = [(gold, canon) for gold, canon in pairs if approximate_canon(gold) is not None]
    assert approximated, "no comma-grouped gold number among the cases: the check would be empty"
    wrong = [
        (gold, canon)
        for gold, canon in approximated
        if parse_wtq_number(approximate_canon(gold)) != parse_wtq_number(canon)
    ]
    assert not wrong, f"approximate_canon disagrees with the canonical values of {wrong}"


def test_without_canonical_values_nothing_the_official_evaluator_rejects_is_accepted(shared_data):
    """Gold typed without its canonical values can only be stricter than the official evaluator."""
    accepted = [
        case["id"]
        for case in _cases(shared_data, "wtq")
        if not case["official"]["correct"] and score("wtq", case["prediction"], case["gold"])["accuracy"]
    ]
    assert not accepted, f"accepted without canonical values, rejected officially: {accepted}"
