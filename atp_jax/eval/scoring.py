"""Which metrics a run records for an answer: the dataset's own, others chosen by name, and a judge.

``Scorer(metrics=("auto",))`` gives each dataset its paper metric (WTQ denotation accuracy, TAT-QA
EM/F1, FeTaQA ROUGE-L recall; WTQ gold is typed by ``meta["target_canon"]`` when the record carries it);
naming metrics adds or replaces them, e.g. ``("rouge", "judge")`` for FeTaQA with an LLM judge as in the
paper. A judge that fails on an answer records ``None``, never 0 (a failure is not a wrong answer), with
the reason under ``judge_error`` and the judge's reply under ``judge_raw``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atp_jax.data.registry import dataset_spec
from atp_jax.eval.judge import Judge, JudgeItem
from atp_jax.eval.metrics import rouge_l_recall, tatqa_em_f1, wtq_accuracy
from atp_jax.tables.table import Example

# A metric: (prediction, gold answers, the example's meta) -> {score name: value}.
MetricFn = Callable[[str, Sequence[str], Mapping[str, Any]], dict[str, float]]


def denotation(prediction: str, answers: Sequence[str], meta: Mapping[str, Any]) -> dict[str, float]:
    """WTQ denotation accuracy; gold typed by ``meta["target_canon"]`` (one canonical value per answer) if given."""
    target_canon = meta.get("target_canon")
    if target_canon is not None and (isinstance(target_canon, str) or len(target_canon) != len(answers)):
        raise ValueError(
            f"meta['target_canon'] must hold one canonical value per answer: {len(answers)} answers "
            f"{list(answers)!r}, target_canon {target_canon!r}; fix the record or drop the key"
        )
    return {"accuracy": wtq_accuracy(prediction, answers, target_canon)}


def em_f1(prediction: str, answers: Sequence[str], meta: Mapping[str, Any]) -> dict[str, float]:
    """TAT-QA exact match and F1 against the gold in ``meta["scale"]`` (none when absent)."""
    em, f1 = tatqa_em_f1(prediction, answers, scale=meta.get("scale", ""), answer_type=meta.get("answer_type", ""))
    return {"em": em, "f1": f1}


def rouge(prediction: str, answers: Sequence[str], meta: Mapping[str, Any]) -> dict[str, float]:
    """FeTaQA's ROUGE-L recall, best over the references."""
    del meta
    return {"rougeL_recall": rouge_l_recall(prediction, answers)}


_METRICS: dict[str, MetricFn] = {"denotation": denotation, "em_f1": em_f1, "rouge": rouge}
AUTO, JUDGE = "auto", "judge"  # the dataset's own metrics; the LLM judge (needs a Judge)


def register_metric(name: str, fn: MetricFn) -> None:
    """Adds a metric that ``Scorer`` (and ``--metrics``) can name; a name is registered once."""
    if name in _METRICS or name in (AUTO, JUDGE):
        raise ValueError(f"metric {name!r} is already registered")
    _METRICS[name] = fn


def metric_names() -> tuple[str, ...]:
    """Every name ``Scorer(metrics=...)`` takes: ``auto``, the registered metrics, ``judge``."""
    return (AUTO, *_METRICS, JUDGE)


def score(
    dataset: str, prediction: str, answers: Sequence[str], meta: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Scores one prediction with the metrics of ``dataset`` (``atp_jax.data.registry``): WTQ ``{"accuracy"}``,
    TAT-QA ``{"em", "f1"}`` (needs ``meta["scale"]``), FeTaQA ``{"rougeL_recall"}``; pass ``example.meta``."""
    spec = dataset_spec(dataset)
    meta = meta or {}
    missing = [key for key in spec.required_meta if key not in meta]
    if missing:
        raise ValueError(
            f"{spec.name} scoring needs meta keys {', '.join(missing)}: pass meta=example.meta, or e.g. "
            f"meta={{{', '.join(repr(k) + ': ...' for k in missing)}}} for data without them"
        )
    out = {}
    for metric in spec.metrics:
        out.update(_METRICS[metric](prediction, answers, meta))
    return out


# An example without a dataset (a table of one's own) is scored as short-answer table QA: WTQ's metric.
_UNNAMED_DATASET = "wtq"


@dataclass(frozen=True)
class Scorer:
    """Scores predictions with ``metrics`` (names in ``metric_names()``); ``judge`` serves ``"judge"``."""

    metrics: tuple[str, ...] = (AUTO,)
    judge: Judge | None = None

    def __post_init__(self):
        object.__setattr__(self, "metrics", tuple(self.metrics))
        unknown = [m for m in self.metrics if m not in metric_names()]
        if unknown or not self.metrics:
            raise ValueError(f"metrics {', '.join(unknown) or '(none)'}: choose from {', '.join(metric_names())}")
        if (JUDGE in self.metrics) != (self.judge is not None):
            raise ValueError(
                "the 'judge' metric needs a judge (a judge model or URL), and a judge needs the 'judge' metric"
            )

    def __call__(self, example: Example, predictions: Sequence[str]) -> list[dict]:
        """One ``{metric: value}`` per prediction; the judge sees all of them in one batch."""
        out = [self._metrics(example, p) for p in predictions]
        if self.judge is not None and predictions:
            items = [JudgeItem(example.question, tuple(example.answers), p) for p in predictions]
            for scores, verdict in zip(out, self.judge.judge(items)):
                scores[JUDGE] = verdict.score
                if verdict.score is None:  # why, and what the judge said, so that the failure can be audited
                    scores["judge_error"] = verdict.error
                    scores["judge_raw"] = verdict.raw
        return out

    def _metrics(self, example: Example, prediction: str) -> dict:
        scores = {}
        for metric in self.metrics:
            if metric == AUTO:
                scores.update(score(example.dataset or _UNNAMED_DATASET, prediction, example.answers, example.meta))
            elif metric != JUDGE:
                scores.update(_METRICS[metric](prediction, example.answers, example.meta or {}))
        return scores
