"""One recorded attack, and one replay of recorded orders, against a victim behind a server.

The records are those of ``runs.experiment`` (``AttackRecord``/``SkipRecord``), so reports read them alike; the
trace adds what the server cost (``server``: requests sent, replies from the cache, seconds) and the objective
(``objective``: ``ce``, or ``score`` when the server returns no log-probabilities, where ``answer_loss`` is
``1 - score``). A server that fails mid-attack gives a skip marked ``retry``: a resume runs the pair again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from atp_jax.attack.blackbox import attack_server
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.problem import AttackInputError
from atp_jax.eval.scoring import Scorer
from atp_jax.inference.server import ServerVictim, VictimError
from atp_jax.runs.experiment import replayed_records
from atp_jax.runs.records import AttackRecord, SkipRecord
from atp_jax.runs.report import first_score
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example


def primary_value(example: Example, scores: dict) -> float:
    """The first number of one answer's scores (the dataset's paper metric, or the judge's when it is the only
    metric), in [0, 1]: what the score objective maximises."""
    value = first_score(scores)
    if value is None:
        raise VictimError(f"example {example.id!r}: no numeric score for the server's answer ({scores})")
    return value


def primary_score(scorer: Scorer):
    """``score_fn`` for the score objective: ``primary_value`` of each answer's scores."""

    def score_fn(example: Example, predictions: Sequence[str]) -> list[float]:
        return [primary_value(example, scores) for scores in scorer(example, predictions)]

    return score_fn


def run_one_server(
    victim: ServerVictim,
    example: Example,
    name: str,
    config: AttackConfig,
    style: PromptStyle,
    *,
    generate: bool = True,
    max_new_tokens: int = 32,
    scorer: Scorer | None = None,
    query_budget: int | None = None,
    problems: dict | None = None,
) -> AttackRecord | SkipRecord:
    """Runs attack ``name`` on ``example`` against ``victim`` and returns its record (``run_one``'s schema).

    ``problems`` is accepted for ``runs.loop`` (the server keeps no per-example precomputation)."""
    del problems
    scorer = scorer or Scorer()
    before = victim.stats()
    try:
        result, evaluator = attack_server(
            victim,
            example,
            config,
            style,
            name=name,
            score_fn=primary_score(scorer),
            max_new_tokens=max_new_tokens,
            query_budget=query_budget,
        )
        start = time.perf_counter()
        prediction, scores = None, {}
        if generate:
            key = (result.row_perm, result.col_perm)
            if key in evaluator.predictions:
                prediction = evaluator.predictions[key]
            else:
                (prediction,) = victim.answers(example, [result.table], style, max_new_tokens)
            (scores,) = scorer(example, [prediction])
        generate_seconds = time.perf_counter() - start
    except AttackInputError as e:
        return SkipRecord(example.id, name, str(e))
    except VictimError as e:
        return SkipRecord(example.id, name, f"victim server failed: {e}", retry=True)
    return AttackRecord(
        id=example.id,
        attack=name,
        row_perm=list(result.row_perm),
        col_perm=list(result.col_perm),
        answer_loss=result.loss,
        clean_loss=result.clean_loss,
        queries=result.queries,
        backward_calls=0,
        seconds=result.seconds,
        prediction=prediction,
        scores=scores,
        generate_seconds=generate_seconds,
        trace={
            **result.trace,
            "objective": evaluator.problem.objective,
            "endpoint": victim.endpoint,
            "server": (victim.stats() - before).as_dict(),
        },
    )


def replay_on_server(
    victim: ServerVictim,
    example: Example,
    sources: Sequence[dict],
    style: PromptStyle,
    *,
    source: dict,
    generate: bool = False,
    max_new_tokens: int = 32,
    scorer: Scorer | None = None,
) -> list[AttackRecord | SkipRecord]:
    """The orders recorded in ``sources`` (records of ``example`` on an open model) replayed on ``victim``: the
    paper's transfer to a black box. One record per source, as ``runs.experiment.replay`` writes them; a failed
    server gives skips marked ``retry``."""
    scorer = scorer or Scorer()
    usable = [r for r in sources if "skipped" not in r]
    for r in usable:
        if r["id"] != example.id:
            raise ValueError(f"replay: record of example {r['id']!r} passed with example {example.id!r}")
    before = victim.stats()
    try:
        start = time.perf_counter()
        tables = [example.table.permute(r["row_perm"], r["col_perm"]) for r in usable]
        if victim.has_logprobs:
            losses = victim.answer_losses(example, [example.table, *tables], style) if usable else []
            clean, chosen = (float(losses[0]), [float(v) for v in losses[1:]]) if usable else (0.0, [])
        if generate or not victim.has_logprobs:
            predictions = victim.answers(example, [example.table, *tables], style, max_new_tokens) if usable else []
            all_scores = scorer(example, predictions) if usable else []  # scored once: a judge is asked once
            if not victim.has_logprobs:
                primary = [1.0 - primary_value(example, scores) for scores in all_scores]
                clean, chosen = (primary[0], primary[1:]) if usable else (0.0, [])
            predictions, scores = predictions[1:], all_scores[1:]
        seconds = time.perf_counter() - start
    except VictimError as e:
        return [SkipRecord(r["id"], r["attack"], f"victim server failed: {e}", source, retry=True) for r in sources]
    except ValueError as e:  # no reference answer for the CE
        return [SkipRecord(r["id"], r["attack"], str(e), source) for r in sources]
    return replayed_records(
        example,
        sources,
        source,
        clean_loss=clean,
        losses=chosen,
        seconds=seconds,
        generated=list(zip(predictions, scores)) if generate else None,
        trace={"objective": "ce" if victim.has_logprobs else "score", "server": (victim.stats() - before).as_dict()},
    )
