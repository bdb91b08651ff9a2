"""Scorer: the dataset's metric by default, named metrics, and a judge whose failures are not zeros."""

import math

import pytest

from atp_jax.eval.judge import JudgeScore, ModelJudge
from atp_jax.eval.scoring import Scorer
from atp_jax.tables.table import Example, Table

TABLE = Table(["Year", "Revenue"], [["2019", "1,200"], ["2020", "1,500"]])
WTQ = Example("Which year had the higher revenue?", TABLE, ["2020"], "w", dataset="wtq")
TATQA = Example(
    "What was the revenue in 2020?",
    TABLE,
    ["1500"],
    "t",
    dataset="tatqa",
    meta={"scale": "thousand", "answer_type": "span"},
)


def test_auto_uses_each_datasets_own_metric():
    assert Scorer()(WTQ, ["2020", "2019"]) == [{"accuracy": 1.0}, {"accuracy": 0.0}]
    (scores,) = Scorer()(TATQA, ["1500"])
    assert set(scores) == {"em", "f1"}


def test_wtq_gold_is_typed_by_its_canonical_values():
    # Officially "17 years" with canonical value 17.0 is the number 17; without it, a string.
    with_canon = Example("How long?", TABLE, ["17 years"], "c", dataset="wtq", meta={"target_canon": ["17.0"]})
    without = Example("How long?", TABLE, ["17 years"], "c", dataset="wtq")
    assert Scorer()(with_canon, ["17", "18"]) == [{"accuracy": 1.0}, {"accuracy": 0.0}]
    assert Scorer(("denotation",))(with_canon, ["17"]) == [{"accuracy": 1.0}]
    assert Scorer()(without, ["17", "17 years"]) == [{"accuracy": 0.0}, {"accuracy": 1.0}]


def test_named_metrics_apply_to_any_dataset():
    (scores,) = Scorer(("denotation", "rouge"))(TATQA, ["1500"])
    assert scores["accuracy"] == 1.0 and scores["rougeL_recall"] == 1.0
    (scores,) = Scorer(("em_f1",))(WTQ, ["2020"])
    assert scores == {"em": 1.0, "f1": 1.0}


def test_judge_scores_in_one_batch_and_failures_stay_none_with_reason_and_reply():
    calls = []

    def generate(prompts):
        calls.append(len(prompts))
        return ["0.8", "no idea", "1.5"]

    out = Scorer(("auto", "judge"), ModelJudge(generate))(WTQ, ["2020", "2019", "2021"])
    assert calls == [3]
    assert out[0] == {"accuracy": 1.0, "judge": 0.8}
    assert out[1] == {"accuracy": 0.0, "judge": None, "judge_error": "unparsable", "judge_raw": "no idea"}
    assert out[2] == {"accuracy": 0.0, "judge": None, "judge_error": "out_of_range", "judge_raw": "1.5"}  # not 1.0
    assert not any(math.isnan(o["accuracy"]) for o in out)
    assert JudgeScore(None, "", "unparsable").score is None


def test_configuration_errors_name_the_fix():
    with pytest.raises(ValueError, match="choose from"):
        Scorer(("bleu",))
    with pytest.raises(ValueError, match="needs a judge"):
        Scorer(("judge",))
    with pytest.raises(ValueError, match="needs the 'judge' metric"):
        Scorer(("auto",), ModelJudge(lambda p: p))
