"""Which metrics a run records for an answer: the dataset's own, others chosen by name, and a judge.

``Scorer(metrics=("auto",))`` gives each dataset its paper metric (WTQ denotation accuracy, TAT-QA
EM/F1, FeTaQA ROUGE-L recall; WTQ gold is typed by ``meta["target_canon"]`` when the record carries it);
naming metrics adds or replaces them, e.g. ``("rouge", "judge")`` for FeTaQA with an LLM judge as in the
paper. A judge that fails on an answer records ``None``, never 0 (a failure is not a wrong answer), with
the reason under ``judge_error`` and the judge's reply under ``judge_raw``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atp_jax.eval.judge import Judge, JudgeItem
from atp_jax.eval.metrics import rouge_l_recall, score, tatqa_em_f1, wtq_accuracy
from atp_jax.tables.table import Example

METRICS = ("auto", "denotation", "em_f1", "rouge", "judge")


@dataclass(frozen=True)
class Scorer:
    """Scores predictions with ``metrics`` (names in ``METRICS``); ``judge`` serves ``"judge"``."""

    metrics: tuple[str, ...] = ("auto",)
    judge: Judge | None = None

    def __post_init__(self):
        object.__setattr__(self, "metrics", tuple(self.metrics))
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown or not self.metrics:
            raise ValueError(f"metrics {', '.join(unknown) or '(none)'}: choose from {', '.join(METRICS)}")
        if ("judge" in self.metrics) != (self.judge is not None):
            raise ValueError(
                "the 'judge' metric needs a judge (a judge model or URL), and a judge needs the 'judge' metric"
            )

    def __call__(self, example: Example, predictions: Sequence[str]) -> list[dict]:
        """One ``{metric: value}`` per prediction; the judge sees all of them in one batch."""
        out = [self._metrics(example, p) for p in predictions]
        if self.judge is not None and predictions:
            items = [JudgeItem(example.question, tuple(example.answers), p) for p in predictions]
            for scores, verdict in zip(out, self.judge.judge(items)):
                scores["judge"] = verdict.score
                if verdict.score is None:  # why, and what the judge said, so that the failure can be audited
                    scores["judge_error"] = verdict.error
                    scores["judge_raw"] = verdict.raw
        return out

    def _metrics(self, example: Example, prediction: str) -> dict:
        scores = {}
        for metric in self.metrics:
            if metric == "auto":
                scores.update(score(example.dataset or "wtq", prediction, example.answers, example.meta))
            elif metric == "denotation":
                scores["accuracy"] = wtq_accuracy(prediction, example.answers, (example.meta or {}).get("target_canon"))
            elif metric == "em_f1":
                meta = example.meta or {}
                em, f1 = tatqa_em_f1(
                    prediction, example.answers, scale=meta.get("scale", ""), answer_type=meta.get("answer_type", "")
                )
                scores.update(em=em, f1=f1)
            elif metric == "rouge":
                scores["rougeL_recall"] = rouge_l_recall(prediction, example.answers)
        return scores
