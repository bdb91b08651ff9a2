"""Robustness of several models to adversarial table orders, paired by question: a base model and models trained
from it (``atp_jax.train``), each evaluated with the same attacks on the same questions into its own results folder.

Per folder (one per model, the base first): the original order's (``vanilla``) mean cross-entropy of the reference
answer and its accuracy (a score of the generated answer, e.g. WTQ's ``accuracy``), and per other attack its mean
CE, its accuracy and its *gain*: attack CE − vanilla CE on the same question, averaged over the questions where
both are recorded. A model is more robust when its gain is lower; it fits better when its vanilla CE is lower.

Then every folder against each *reference* folder before it (by default the first two: the base model and, say,
a clean fine-tune, so that an adversarially trained model is set against both): the mean per-question difference
(folder − reference) of vanilla CE, of vanilla accuracy and of each attack's gain, over the questions measured in
both folders (skips left out), with its 95% BCa bootstrap interval (:mod:`atp_jax.stats`: questions resampled with
both of their values; none below 3 questions) and the number of questions on which it is lower and higher.
Questions differ far more than models do, so only the paired difference can show a small change.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

import numpy as np

from atp_jax.attack.presets import attack_names
from atp_jax.runs.folders import Run
from atp_jax.runs.report import LOSS_METRIC, SCORE_METRICS, interval_text, paper_order
from atp_jax.stats import MIN_VALUES, bootstrap_interval, has_interval

ORIGINAL = "vanilla"
REFERENCES = 2


@dataclasses.dataclass(frozen=True)
class Robustness:
    """What ``robustness`` finds.

    labels: each folder's name in the tables, in the order given.
    metric: the score behind "accuracy" (None: no folder recorded a score, e.g. runs with ``--nogenerate``).
    attacks: the attacks whose gains are reported, vanilla excluded.
    folder_rows: one dict per (folder, attack), vanilla first: ``folder``, ``path``, ``attack``, ``questions``,
      ``mean_ce``, ``accuracy`` (None without a metric) and for the attacks ``gain_questions``, ``mean_gain``,
      ``gain_ci_low``, ``gain_ci_high`` (None for vanilla; NaN ends below 3 questions).
    comparison_rows: one dict per (folder, reference, quantity): ``folder``, ``reference``, ``quantity``
      (``vanilla_ce``, ``vanilla_accuracy`` or ``gain``), ``attack`` (the gain's; vanilla for the others),
      ``questions``, ``mean_difference`` (folder − reference), ``ci_low``, ``ci_high``, ``lower``, ``higher``
      (question counts; ties are neither).
    """

    labels: tuple[str, ...]
    metric: str | None
    attacks: tuple[str, ...]
    folder_rows: tuple[dict, ...]
    comparison_rows: tuple[dict, ...]


def folder_labels(runs: Sequence[Run]) -> list[str]:
    """Each folder's directory name; where two share one, their run.json model names; where those are shared too,
    the folders' paths as given."""
    for name in (lambda run: run.folder.name, lambda run: run.model, lambda run: str(run.folder)):
        labels = [name(run) for run in runs]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{run.folder} ({i})" for i, run in enumerate(runs)]  # the same folder given twice


def _values(run: Run, attack: str, metric: str) -> dict[str, float]:
    """Question id -> the recorded value of ``metric`` (``answer_loss`` or a score) of ``attack``; skips and
    unmeasured values (a judge's null) left out."""
    out = {}
    for record in run.records:
        if record.get("attack") != attack or "skipped" in record:
            continue
        value = record.get(LOSS_METRIC) if metric == LOSS_METRIC else (record.get("scores") or {}).get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[record["id"]] = float(value)
    return out


def _recorded_scores(run: Run) -> set[str]:
    return {
        metric
        for record in run.records
        if record.get("attack") == ORIGINAL and "skipped" not in record
        for metric, value in (record.get("scores") or {}).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def _choose_metric(runs: Sequence[Run], requested: str | None) -> str | None:
    """``requested`` when every folder's vanilla records carry it; by default the first of ``SCORE_METRICS``
    (each dataset's own) that all carry, else the first other score they share, else None."""
    recorded = [_recorded_scores(run) for run in runs]
    if requested is not None:
        if requested == LOSS_METRIC:
            raise ValueError(
                f"metric {LOSS_METRIC} is the CE the report already shows; name a score for the accuracy "
                f"(one of {', '.join(sorted(set.union(*recorded))) or 'none recorded'}) or leave the metric out"
            )
        for run, scores in zip(runs, recorded):
            if requested not in scores:
                raise ValueError(
                    f"{run.folder}: the vanilla records carry no {requested!r} score (recorded: "
                    f"{', '.join(sorted(scores)) or 'none: a run with --nogenerate'}); name a score every folder "
                    "records, or evaluate the folder with generation"
                )
        return requested
    shared = set.intersection(*recorded)
    return next((m for m in SCORE_METRICS if m in shared), None) or min(shared, default=None)


def _choose_attacks(runs: Sequence[Run], requested: Sequence[str] | None) -> list[str]:
    """The attacks asked for (canonical names; each must be recorded in every folder), by default every attack
    recorded in all of them, the paper's order first; vanilla is the baseline, never in the list."""
    recorded = [{r["attack"] for r in run.records if "skipped" not in r} for run in runs]
    if requested is None:
        shared = set.intersection(*recorded) - {ORIGINAL}
        return paper_order(r["attack"] for r in runs[0].records if r["attack"] in shared)
    wanted = [a for a in attack_names(requested) if a != ORIGINAL]
    for run, attacks in zip(runs, recorded):
        missing = [a for a in wanted if a not in attacks]
        if missing:
            raise ValueError(
                f"{run.folder} has no records of {', '.join(missing)} (recorded: "
                f"{', '.join(sorted(attacks)) or 'none'}); evaluate it with atp-attack --attacks "
                f"{','.join([ORIGINAL, *wanted])} into that folder, or leave those attacks out"
            )
    return wanted


def _gains(run: Run, attack: str) -> dict[str, float]:
    """Question id -> attack CE − vanilla CE, on the questions where both are recorded."""
    original, attacked = _values(run, ORIGINAL, LOSS_METRIC), _values(run, attack, LOSS_METRIC)
    return {q: attacked[q] - original[q] for q in attacked if q in original}


def _mean(values) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def _paired(folder: dict[str, float], reference: dict[str, float], resamples: int, seed: int) -> dict | None:
    """The paired difference folder − reference over the questions both measured (None when they share none)."""
    common = sorted(set(folder) & set(reference))
    if not common:
        return None
    diff = np.array([folder[q] - reference[q] for q in common])
    low, high = bootstrap_interval(diff, resamples=resamples, seed=seed)
    return {
        "questions": len(common),
        "mean_difference": float(diff.mean()),
        "ci_low": low,
        "ci_high": high,
        "lower": int((diff < 0).sum()),
        "higher": int((diff > 0).sum()),
    }


def robustness(
    runs: Sequence[Run],
    attacks: Sequence[str] | None = None,
    metric: str | None = None,
    references: int = REFERENCES,
    resamples: int = 2000,
    seed: int = 0,
) -> Robustness:
    """Per folder of ``runs`` (one model each, the base first) its vanilla CE and accuracy and each attack's CE,
    accuracy and gain; then each folder against each of the first ``references`` folders given before it, paired
    by question (module docstring).

    ``attacks``: the attacks whose gains to report (names or specs; default: every attack recorded in all folders).
    ``metric``: the score that is the accuracy (default: each dataset's own, the first of ``SCORE_METRICS`` that
    every folder records; none when no score is recorded). ``resamples``/``seed``: the bootstrap's.

    ``ValueError`` naming the folder and the fix when: fewer than two folders, ``references`` < 1, folders of
    different datasets, a folder without vanilla records, an attack or metric asked for that a folder lacks, or a
    folder sharing fewer than 3 questions with vanilla recorded with one of its references.
    """
    runs = list(runs)
    if len(runs) < 2:
        raise ValueError(
            f"{len(runs)} results folder given; the robustness report compares models: give the base model's "
            "folder first, then one per trained model"
        )
    if references < 1:
        raise ValueError(f"references={references}: compare with at least the first folder (give 1 or more)")
    for run in runs[1:]:
        if run.dataset != runs[0].dataset:
            raise ValueError(
                f"{run.folder} holds {run.dataset!r} questions but {runs[0].folder} {runs[0].dataset!r}; "
                "compare folders evaluated on the same questions"
            )
    vanilla = [_values(run, ORIGINAL, LOSS_METRIC) for run in runs]
    for run, values in zip(runs, vanilla):
        if not values:
            raise ValueError(
                f"{run.folder} has no vanilla records (every figure here is relative to the original order); "
                f"evaluate it with atp-attack --attacks {ORIGINAL},... into that folder"
            )
    chosen_metric = _choose_metric(runs, metric)
    chosen_attacks = _choose_attacks(runs, attacks)
    labels = folder_labels(runs)

    scores = [
        {a: _values(run, a, chosen_metric) if chosen_metric else {} for a in [ORIGINAL, *chosen_attacks]}
        for run in runs
    ]
    gains = [{a: _gains(run, a) for a in chosen_attacks} for run in runs]
    folder_rows = []
    for i, run in enumerate(runs):
        for attack in [ORIGINAL, *chosen_attacks]:
            ce = vanilla[i] if attack == ORIGINAL else _values(run, attack, LOSS_METRIC)
            row = {
                "folder": labels[i],
                "path": str(run.folder),
                "attack": attack,
                "questions": len(ce),
                "mean_ce": _mean(ce.values()),
                "accuracy": _mean(scores[i][attack].values()) if chosen_metric else None,
                "gain_questions": None,
                "mean_gain": None,
                "gain_ci_low": None,
                "gain_ci_high": None,
            }
            if attack != ORIGINAL:
                gain = np.array(list(gains[i][attack].values()))
                low, high = bootstrap_interval(gain, resamples=resamples, seed=seed) if gain.size else (None, None)
                row.update(
                    gain_questions=int(gain.size),
                    mean_gain=float(gain.mean()) if gain.size else None,
                    gain_ci_low=low,
                    gain_ci_high=high,
                )
            folder_rows.append(row)

    comparison_rows = []
    for i, run in enumerate(runs):
        for r in range(min(i, references)):
            shared = len(set(vanilla[i]) & set(vanilla[r]))
            if shared < MIN_VALUES:
                raise ValueError(
                    f"{run.folder} and {runs[r].folder} share {shared} question(s) with vanilla recorded in both; "
                    f"a paired comparison needs at least {MIN_VALUES}: evaluate both models on the same questions "
                    "(the same --dataset, --split and --ids or --num_examples)"
                )
            quantities = [("vanilla_ce", ORIGINAL, vanilla[i], vanilla[r])]
            if chosen_metric:
                quantities.append(("vanilla_accuracy", ORIGINAL, scores[i][ORIGINAL], scores[r][ORIGINAL]))
            quantities += [("gain", a, gains[i][a], gains[r][a]) for a in chosen_attacks]
            for quantity, attack, mine, theirs in quantities:
                figures = _paired(mine, theirs, resamples, seed)
                if figures is not None:
                    comparison_rows.append(
                        {"folder": labels[i], "reference": labels[r], "quantity": quantity, "attack": attack, **figures}
                    )
    return Robustness(tuple(labels), chosen_metric, tuple(chosen_attacks), tuple(folder_rows), tuple(comparison_rows))


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _gain_text(row: dict) -> str:
    if row["mean_gain"] is None:
        return "–"
    low, high = row["gain_ci_low"], row["gain_ci_high"]
    half = f"{(high - low) / 2:.3f}" if has_interval(low, high) else "n/a"
    return f"{row['mean_gain']:+.3f} ± {half}"


def _quantity_name(row: dict, metric: str | None) -> str:
    return {"vanilla_ce": "vanilla CE", "vanilla_accuracy": f"vanilla {metric}"}.get(
        row["quantity"], f"{row['attack']} gain"
    )


def robustness_markdown(result: Robustness) -> str:
    """Two markdown tables: per model (rows) the vanilla CE and accuracy and per attack its CE, accuracy and mean
    gain ± half its 95% BCa interval, with the questions behind each; then the paired comparisons, one line per
    (model, reference, quantity): questions, mean difference [95% CI], and on how many questions it is lower and
    higher."""
    metric = result.metric or "accuracy"
    by_folder: dict[str, dict[str, dict]] = {}
    for row in result.folder_rows:
        by_folder.setdefault(row["folder"], {})[row["attack"]] = row
    header = ["model", "questions", "vanilla CE", f"vanilla {metric}"]
    for attack in result.attacks:
        header += [f"{attack} CE", f"{attack} {metric}", f"{attack} gain"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in result.labels:
        rows = by_folder[label]
        cells = [label, str(rows[ORIGINAL]["questions"]), _number(rows[ORIGINAL]["mean_ce"])]
        cells.append(_number(rows[ORIGINAL]["accuracy"]))
        for attack in result.attacks:
            row = rows[attack]
            cells += [_number(row["mean_ce"]), _number(row["accuracy"]), _gain_text(row)]
        lines.append("| " + " | ".join(cells) + " |")
    counts = {row["gain_questions"] for row in result.folder_rows if row["gain_questions"] is not None}
    note = f" (n/a below {MIN_VALUES} questions)" if min(counts, default=MIN_VALUES) < MIN_VALUES else ""
    without_metric = "" if result.metric else "; no score is recorded in every folder (runs without generation)"
    intro = (
        "gain: attack CE − vanilla CE per question, mean ± half its 95% BCa bootstrap interval"
        f"{note}; CE: the reference answer's mean cross-entropy; {metric}: the generated answer's{without_metric}"
    )
    sections = [intro, "\n".join(lines)]
    comparison = [
        "| model | against | Δ (model − reference) | questions | mean [95% CI] | lower on | higher on |",
        "|---|---|---|---|---|---|---|",
    ]
    comparison += [
        f"| {r['folder']} | {r['reference']} | {_quantity_name(r, result.metric)} | {r['questions']} | "
        f"{r['mean_difference']:+.3f} {interval_text(r['ci_low'], r['ci_high'])} | "
        f"{r['lower']}/{r['questions']} | {r['higher']}/{r['questions']} |"
        for r in result.comparison_rows
    ]
    sections += [
        "Paired by question (the questions measured in both folders): a lower gain is a more robust model, a lower "
        "vanilla CE a better fit.",
        "\n".join(comparison),
    ]
    return "\n\n".join(sections)
