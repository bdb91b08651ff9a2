"""A dataset and a metric are each one registration: added here from a test module, then loaded, scored and
asked for through the same paths as the built-in ones."""

import json

import pytest

from atp_jax.data import datasets, registry
from atp_jax.eval import scoring
from atp_jax.tables import prompt
from atp_jax.tables.prompt import PromptStyle, instruction


@pytest.fixture
def toy_registries(monkeypatch):
    monkeypatch.setattr(registry, "_DATASETS", dict(registry._DATASETS))
    monkeypatch.setattr(prompt, "_ANSWER_INSTRUCTIONS", dict(prompt._ANSWER_INSTRUCTIONS))
    monkeypatch.setattr(scoring, "_METRICS", dict(scoring._METRICS))

    def exact(prediction, answers, meta):
        return {"exact": float(prediction.strip().lower() in {a.lower() for a in answers})}

    scoring.register_metric("exact", exact)
    registry.register_dataset(
        registry.DatasetSpec("toyqa", metrics=("exact",), answer_instruction="Answer with one word.")
    )


def test_registered_dataset_loads_scores_and_prompts(toy_registries, tmp_path):
    path = tmp_path / "toy.jsonl"
    record = {
        "id": "t1",
        "dataset": "toyqa",
        "question": "Which colour?",
        "answers": ["Red"],
        "table": {"header": ["name", "colour"], "rows": [["Alice", "Red"]]},
    }
    path.write_text(json.dumps(record) + "\n")
    [example] = datasets.load_dataset(path)
    assert "toyqa" in datasets.dataset_choices()
    assert scoring.Scorer(("auto",))(example, ["red", "blue"]) == [{"exact": 1.0}, {"exact": 0.0}]
    assert scoring.score("toyqa", "Red", ["red"]) == {"exact": 1.0}
    assert "Answer with one word. If there are several answers" in instruction(PromptStyle(), "toyqa")
    assert "Answer with one word" not in instruction(PromptStyle(answer_format="plain"), "toyqa")
    assert "exact" in scoring.metric_names()
    assert scoring.Scorer(("exact",))(example, ["RED"]) == [{"exact": 1.0}]


def test_registering_twice_is_refused(toy_registries):
    with pytest.raises(ValueError, match="already registered"):
        registry.register_dataset(registry.DatasetSpec("wtq", metrics=("denotation",)))
    with pytest.raises(ValueError, match="already registered"):
        scoring.register_metric("rouge", scoring.rouge)


def test_unregistered_dataset_names_the_registered_ones():
    with pytest.raises(ValueError, match="not registered: use one of wtq, tatqa, fetaqa"):
        registry.dataset_spec("squad")
    with pytest.raises(ValueError, match="use one of wtq, tatqa, fetaqa"):
        datasets._record_with_dataset({"dataset": "squad"}, None)
