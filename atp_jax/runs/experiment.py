"""What the experiment binaries share: choosing examples, where results go, one recorded attack.

``run_attack.py``, ``ablate.py`` and ``transfer.py`` all write the same record schema (see
``run_one``) into ``results.jsonl`` (one process) or ``results.shardK.jsonl`` (process K of several),
with a ``run.json`` / ``run.shardK.json`` manifest beside it, so ``report.py`` reads any of them.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections.abc import Sequence

import jax

from atp_jax.attack import registry
from atp_jax.attack.batched import attack_many, bucket_key
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.problem import AttackInputError, AttackProblem, make_problem
from atp_jax.attack.run import attack, check_mode
from atp_jax.data.datasets import DEFAULT_ORDER_FILTER, filter_examples, load_dataset
from atp_jax.defense.smoothing import SmoothingConfig, smoothed_answers
from atp_jax.eval.scoring import Scorer
from atp_jax.inference.qa import (
    InputTooLong,
    answer_losses,
    answers,
    answers_many,
    check_context,
    prompt_ids,
)
from atp_jax.models.loading import LoadedModel
from atp_jax.runs.records import AttackRecord, SkipRecord
from atp_jax.tables.buckets import DEFAULT_BUCKETS, BucketGrid
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example
from atp_jax.version import __version__


def select_examples(
    dataset: str,
    split: str = "dev",
    data_dir: str | os.PathLike | None = None,
    num_examples: int = 0,
    drop_order_sensitive: bool = True,
    max_rows: int | None = None,
    max_cols: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    order_filter: str = DEFAULT_ORDER_FILTER,
    ids: Sequence[str] = (),
) -> list[Example]:
    """The examples one process attacks.

    Loads ``dataset``; drops the questions whose correct answer depends on the table's order ("who is
    listed last?", by the rule named ``order_filter``: ``"classifier"`` reads the question and the table,
    ``"keywords"`` is the paper's keyword rule; see ``atp_jax.data.order_filter``;
    ``drop_order_sensitive=False`` keeps them), because a permutation must not change the right answer —
    else an "attack" that changes the model's answer is simply correct; keeps tables of at most
    ``max_rows`` x ``max_cols``; with ``ids``, only the questions of those ids (in the dataset's order; an id
    the dataset lacks or the filters drop raises, saying which); takes the first ``num_examples`` (0: all), then every
    ``process_count``-th from ``process_index``: shards are disjoint and together cover the selection,
    whatever the number of processes.
    """
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} must be in [0, process_count={process_count}); "
            "pass --process_index K --process_count N with 0 <= K < N"
        )
    if num_examples < 0:
        raise ValueError(f"num_examples={num_examples}: pass 0 for all examples or a positive count")
    loaded = load_dataset(dataset, split, data_dir)
    examples = filter_examples(
        loaded,
        order_sensitive=False if drop_order_sensitive else None,
        max_rows=max_rows,
        max_cols=max_cols,
        order_filter=order_filter,
    )
    if ids:
        kept = {example.id for example in examples}
        missing = [i for i in ids if i not in kept]
        if missing:
            known = {example.id for example in loaded}
            absent = [i for i in missing if i not in known]
            raise ValueError(
                f"ids {', '.join(absent)} are not in the {split} split"
                if absent
                else f"ids {', '.join(missing)} are dropped by the filters (order-sensitive question or a table over "
                "max rows/columns): loosen them, or pick other ids"
            )
        wanted = set(ids)
        examples = [example for example in examples if example.id in wanted]
    if num_examples:
        examples = examples[:num_examples]
    return examples[process_index::process_count]


def environment() -> dict:
    """Versions and devices, for a run's manifest (touches the JAX backend)."""
    return {
        "jax": jax.__version__,
        "atp_jax": __version__,
        "python": platform.python_version(),
        "devices": [str(d) for d in jax.devices()],
    }


def _answer_and_scores(
    model: LoadedModel, example: Example, tables, style: PromptStyle, max_new_tokens: int, scorer: Scorer | None
):
    predictions = answers(model, example, tables, style, max_new_tokens)
    return list(zip(predictions, (scorer or Scorer())(example, predictions)))


def memory_budget_bytes(gigabytes: float | None = None) -> int:
    """``gigabytes`` in bytes; by default half of this machine's physical memory."""
    if gigabytes is not None:
        return int(gigabytes * 2**30)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def run_one(
    model: LoadedModel,
    example: Example,
    name: str,
    config: AttackConfig,
    style: PromptStyle,
    *,
    problems: dict | None = None,
    generate: bool = True,
    max_new_tokens: int = 32,
    smoothing: SmoothingConfig | None = None,
    smoothing_ks: Sequence[int] | None = None,
    scorer: Scorer | None = None,
    memory_budget_bytes: int | None = None,
    buckets: BucketGrid | None = DEFAULT_BUCKETS,
) -> AttackRecord | SkipRecord:
    """Runs attack ``name`` (configured by ``config``) on ``example`` and returns its result record.

    The record is an ``AttackRecord`` (``atp_jax.runs.records``: the chosen order, its and the original
    order's reference-answer loss, the answer and its scores — ``scorer``'s metrics, by default the
    dataset's own, {} without ``generate`` — the attack's counted queries and time, its trace); an example
    the attack cannot take gives a ``SkipRecord`` with the reason.

    ``problems`` caches the example's precomputation by objective across calls; pass the same dict for
    every attack of one example (and a fresh one for the next example).

    ``memory_budget_bytes`` skips an example whose attention weights alone would exceed it (a long cell can ask
    for tens of GB), with the reason recorded.

    ``buckets`` pads the attack's tensors to shape buckets (``make_problem``); the record is the same either way.

    ``smoothing`` (needs ``generate``) adds the permutation-smoothing defense on the chosen order:
    ``defended`` maps ``smooth_kK`` for each K in ``smoothing_ks`` (default ``(smoothing.k,)``) to
    ``{"prediction", "scores", "agreement"}`` (see ``atp_jax.defense.smoothing``), and ``defense_seconds``
    the time of its one batched generation.
    """
    _check_smoothing(smoothing, generate)
    problems = {} if problems is None else problems
    try:
        problem = _prepare(
            model, example, config, style, problems, generate, max_new_tokens, memory_budget_bytes, buckets
        )
        result = attack(model, example, config, style, name=name, problem=problem)
    except (AttackInputError, InputTooLong) as e:
        return SkipRecord(example.id, name, str(e))
    start = time.perf_counter()
    prediction, scores = None, {}
    if generate:
        ((prediction, scores),) = _answer_and_scores(model, example, [result.table], style, max_new_tokens, scorer)
    return _record(
        model,
        example,
        name,
        result,
        style,
        prediction,
        scores,
        time.perf_counter() - start,
        smoothing=smoothing,
        smoothing_ks=smoothing_ks,
        scorer=scorer,
        max_new_tokens=max_new_tokens,
    )


def run_group(
    model: LoadedModel,
    examples: Sequence[Example],
    name: str,
    config: AttackConfig,
    style: PromptStyle,
    *,
    problems: dict[str, dict] | None = None,
    generate: bool = True,
    max_new_tokens: int = 32,
    smoothing: SmoothingConfig | None = None,
    smoothing_ks: Sequence[int] | None = None,
    scorer: Scorer | None = None,
    memory_budget_bytes: int | None = None,
    buckets: BucketGrid | None = DEFAULT_BUCKETS,
) -> list[AttackRecord | SkipRecord]:
    """``run_one`` for several examples at once: the examples of one shape bucket are attacked as one batch
    (``atp_jax.attack.batched.attack_many``) and their answers generated in one batch; one record per example,
    in order, each as ``run_one`` would make it (its ``seconds`` the example's share of its group's time).

    ``problems`` maps an example's id to its precomputation cache (as ``run_one``'s ``problems``).
    """
    _check_smoothing(smoothing, generate)
    problems = {} if problems is None else problems
    records: dict[str, AttackRecord | SkipRecord] = {}
    groups: dict[tuple, list[tuple[Example, AttackProblem]]] = {}
    for example in examples:
        try:
            check_mode(example, config)
            cache = problems.setdefault(example.id, {})
            problem = _prepare(
                model, example, config, style, cache, generate, max_new_tokens, memory_budget_bytes, buckets
            )
        except (AttackInputError, InputTooLong) as e:
            records[example.id] = SkipRecord(example.id, name, str(e))
        else:
            groups.setdefault(bucket_key(problem), []).append((example, problem))
    for group in groups.values():
        try:
            results = attack_many(model, [problem for _, problem in group], config, name)
        except AttackInputError:  # some example of the group cannot take it: each alone, for its own record
            for example, _ in group:
                records[example.id] = run_one(
                    model,
                    example,
                    name,
                    config,
                    style,
                    problems=problems[example.id],
                    generate=generate,
                    max_new_tokens=max_new_tokens,
                    smoothing=smoothing,
                    smoothing_ks=smoothing_ks,
                    scorer=scorer,
                    memory_budget_bytes=memory_budget_bytes,
                    buckets=buckets,
                )
            continue
        start = time.perf_counter()
        predictions: list = [None] * len(group)
        if generate:
            questions = [(example, result.table) for (example, _), result in zip(group, results)]
            predictions = answers_many(model, questions, style, max_new_tokens)
        share = (time.perf_counter() - start) / len(group)
        for (example, _), result, prediction in zip(group, results, predictions):
            scores = (scorer or Scorer())(example, [prediction])[0] if generate else {}
            records[example.id] = _record(
                model,
                example,
                name,
                result,
                style,
                prediction,
                scores,
                share,
                smoothing=smoothing,
                smoothing_ks=smoothing_ks,
                scorer=scorer,
                max_new_tokens=max_new_tokens,
            )
    return [records[example.id] for example in examples]


def _check_smoothing(smoothing: SmoothingConfig | None, generate: bool) -> None:
    if smoothing is not None and not generate:
        raise ValueError("smoothing votes over generated answers: pass generate=True, or smoothing=None")


def _prepare(
    model: LoadedModel,
    example: Example,
    config: AttackConfig,
    style: PromptStyle,
    problems: dict,
    generate: bool,
    max_new_tokens: int,
    memory_budget_bytes: int | None,
    buckets: BucketGrid | None,
) -> AttackProblem:
    """The example's problem for ``config``'s objective (from ``problems`` or made into it); raises
    ``AttackInputError`` / ``InputTooLong`` for an example the attack cannot take."""
    if generate:  # the answer under the chosen order must fit too: find out before the attack runs
        check_context(model, example, len(prompt_ids(model, example, style=style)), max_new_tokens)
    if config.objective not in problems:
        problems[config.objective] = make_problem(model, example, style, config.objective, buckets=buckets)
    problem = problems[config.objective]
    if memory_budget_bytes is not None:
        method = registry.method_of(config)
        batch = getattr(config, "restarts", 1) if method.uses_gradient else problem.candidate_batches[-1]
        need = problem.attention_bytes(model.config, batch, through_layers=method.uses_gradient)
        if need > memory_budget_bytes:
            raise AttackInputError(
                f"example {example.id!r}: attention alone needs {need / 2**30:.1f} GiB, over the "
                f"memory budget of {memory_budget_bytes / 2**30:.1f} GiB (--memory_budget_gb)"
            )
    return problem


def _record(
    model: LoadedModel,
    example: Example,
    name: str,
    result,
    style: PromptStyle,
    prediction: str | None,
    scores: dict,
    generate_seconds: float,
    *,
    smoothing: SmoothingConfig | None,
    smoothing_ks: Sequence[int] | None,
    scorer: Scorer | None,
    max_new_tokens: int,
) -> AttackRecord:
    """The record of one attack's result (and, with ``smoothing``, the defense on its order)."""
    record = AttackRecord(
        id=example.id,
        attack=name,
        row_perm=list(result.row_perm),
        col_perm=list(result.col_perm),
        answer_loss=result.loss,
        clean_loss=result.clean_loss,
        queries=result.queries,
        backward_calls=result.backward_calls,
        seconds=result.seconds,
        prediction=prediction,
        scores=scores,
        generate_seconds=generate_seconds,
        trace=result.trace,
    )
    if smoothing is not None:
        start = time.perf_counter()
        # The defense answers the table the attack chose: what a defended system would receive.
        smoothed = smoothed_answers(model, example, result.table, smoothing, style, max_new_tokens, smoothing_ks)
        defended = list(smoothed.items())
        defended_scores = (scorer or Scorer())(example, [a.prediction for _, a in defended])
        record = dataclasses.replace(
            record,
            defended={
                f"smooth_k{k}": {"prediction": a.prediction, "agreement": a.agreement, "scores": scores}
                for (k, a), scores in zip(defended, defended_scores)
            },
            defense_seconds=time.perf_counter() - start,
        )
    return record


def replay(
    model: LoadedModel,
    example: Example,
    sources: Sequence[dict],
    style: PromptStyle,
    *,
    source: dict,
    generate: bool = False,
    max_new_tokens: int = 32,
    scorer: Scorer | None = None,
) -> list[AttackRecord | SkipRecord]:
    """Scores the orders recorded in ``sources`` (records of ``example`` from another run) on ``model``.

    All orders and the original one are scored in one batched ``answer_losses`` call; with
    ``generate`` the model also answers under each order. Returns one record per source, in the
    schema of ``run_one`` (``queries``: 1 forward per order; ``trace`` empty) plus
    ``transferred_from``: ``source`` (where the orders come from) with the source record's
    ``answer_loss``. A skipped source record stays skipped.
    """
    usable = [r for r in sources if "skipped" not in r]
    for r in usable:
        if r["id"] != example.id:
            raise ValueError(f"replay: record of example {r['id']!r} passed with example {example.id!r}")
    start = time.perf_counter()
    tables = [example.table.permute(r["row_perm"], r["col_perm"]) for r in usable]
    losses = answer_losses(model, example, [example.table, *tables], style) if usable else []
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    generated = []
    if generate and usable:
        generated = _answer_and_scores(model, example, tables, style, max_new_tokens, scorer)
    generate_seconds = time.perf_counter() - start
    return replayed_records(
        example,
        sources,
        source,
        clean_loss=float(losses[0]) if usable else 0.0,
        losses=[float(v) for v in losses[1:]],
        seconds=seconds,
        generated=generated if generate else None,
        generate_seconds=generate_seconds,
    )


def replayed_records(
    example: Example,
    sources: Sequence[dict],
    source: dict,
    *,
    clean_loss: float,
    losses: Sequence[float],
    seconds: float,
    generated: Sequence[tuple[str, dict]] | None = None,
    generate_seconds: float = 0.0,
    trace: dict | None = None,
) -> list[AttackRecord | SkipRecord]:
    """One record per source record of ``example``: a skipped source stays skipped; the others, in order, take
    ``losses`` (and ``generated``'s (prediction, scores)), with the time shared out and ``transferred_from`` =
    ``source`` plus the source record's ``answer_loss``."""
    replayed = max(1, len(losses))
    out, k = [], 0
    for r in sources:
        if "skipped" in r:
            out.append(SkipRecord(r["id"], r["attack"], r["skipped"], transferred_from=source))
            continue
        prediction, scores = generated[k] if generated is not None else (None, {})
        out.append(
            AttackRecord(
                id=example.id,
                attack=r["attack"],
                row_perm=list(r["row_perm"]),
                col_perm=list(r["col_perm"]),
                answer_loss=losses[k],
                clean_loss=clean_loss,
                queries=1,
                backward_calls=0,
                seconds=seconds / replayed,
                prediction=prediction,
                scores=scores,
                generate_seconds=generate_seconds / replayed,
                transferred_from={**source, "answer_loss": r.get("answer_loss")},
                trace=trace or {},
            )
        )
        k += 1
    return out
