"""Ablation views: the λ / N_attack / learning-rate sweeps of one preset (spec per swept value) and the
one-option-at-a-time table."""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections import defaultdict
from collections.abc import Iterable

from atp_jax.attack.presets import PRESETS, preset
from atp_jax.plotting import new_figure, save_figure
from atp_jax.runs.report import (
    LOSS_METRIC,
    SCORE_METRICS,
    available_metrics,
    interval_text,
    metric_value,
    paired_comparisons,
)
from atp_jax.stats import bootstrap_interval, has_interval

# A swept parameter -> the config fields it sets (λ sets λ_r and λ_c together).
SWEPT_FIELDS = {"lambda": ("lambda_row", "lambda_col"), "n_attack": ("n_attack",), "lr": ("lr",)}


def sweep_overrides(parameter: str, value: float) -> dict:
    """The config overrides of one sweep point (``ablate.py`` names the point ``canonical(base, **these)``)."""
    return {field: value for field in SWEPT_FIELDS[parameter]}


def sweep_value(name: str, parameter: str) -> float | None:
    """The swept ``parameter``'s value in attack spec ``name``, or None when ``name`` is not a point of that
    sweep (it changes other fields of its preset, or is not a spec at all)."""
    try:
        config = preset(name)
    except ValueError:
        return None
    base = PRESETS[name.partition("@")[0]]
    fields = SWEPT_FIELDS[parameter]
    if not all(hasattr(config, f) for f in fields):
        return None
    changed = {f.name for f in dataclasses.fields(config) if getattr(config, f.name) != getattr(base, f.name)}
    values = {getattr(config, f) for f in fields}
    return float(values.pop()) if changed <= set(fields) and len(values) == 1 else None


def sweep_rows(records: Iterable[dict], parameter: str, metric: str | None = None) -> list[dict]:
    """Table-5-style rows of one sweep, by value: examples, mean loss with its 95% BCa bootstrap interval
    (``loss_ci_low``/``loss_ci_high``; NaN below three examples), mean clean loss, mean ``metric`` (default: the
    first recorded of ``SCORE_METRICS``; omitted when none was recorded)."""
    records = [r for r in records if "skipped" not in r]
    points: dict[float, list[dict]] = defaultdict(list)
    for r in records:
        value = sweep_value(r["attack"], parameter)
        if value is not None:
            points[value].append(r)
    if metric is None:
        metric = next((m for m in SCORE_METRICS if m in available_metrics(records)), None)
    rows = []
    for value in sorted(points):
        recs = points[value]
        losses = [r["answer_loss"] for r in recs]
        low, high = bootstrap_interval(losses)
        row = {
            parameter: int(value) if value.is_integer() else value,
            "examples": len(recs),
            "mean_loss": statistics.fmean(losses),
            "loss_ci_low": low,
            "loss_ci_high": high,
            "mean_clean_loss": statistics.fmean(r["clean_loss"] for r in recs),
        }
        if metric is not None:
            values = [v for r in recs if (v := metric_value(r, metric)) is not None]
            row[f"mean_{metric}"] = statistics.fmean(values) if values else float("nan")
        rows.append(row)
    return rows


def plot_sweeps(sweeps: dict[str, list[dict]], path: str | os.PathLike) -> list[os.PathLike]:
    """Figure-6-style chart, PDF and PNG (``path`` with each suffix): a panel per swept parameter, mean loss
    with its BCa interval (left axis) and, where recorded, the mean score (right axis) against the parameter's
    value; the examples per point in the title."""
    sweeps = {p: rows for p, rows in sweeps.items() if rows}
    if not sweeps:
        raise ValueError("plot_sweeps: no sweep has any recorded point")
    figure = new_figure(4.5 * len(sweeps), 3.5)
    axes = figure.subplots(1, len(sweeps), squeeze=False)[0]
    for ax, (parameter, rows) in zip(axes, sweeps.items()):
        x = [row[parameter] for row in rows]
        means = [row["mean_loss"] for row in rows]
        err = [
            [m - row["loss_ci_low"], row["loss_ci_high"] - m]
            if has_interval(row["loss_ci_low"], row["loss_ci_high"])
            else [0, 0]
            for m, row in zip(means, rows)
        ]
        ax.errorbar(x, means, yerr=list(zip(*err)), fmt="o-", color="tab:red", capsize=3)
        ax.set_xticks(x)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel(parameter)
        counts = sorted({row["examples"] for row in rows})
        n = f"n={counts[0]}" if len(counts) == 1 else f"n={counts[0]}–{counts[-1]}"
        ax.set_title(f"{parameter} sweep ({n} examples per point)")
        ax.set_ylabel("mean answer loss (95% BCa interval)", color="tab:red")
        score_keys = [k for k in rows[0] if k.startswith("mean_") and k not in ("mean_loss", "mean_clean_loss")]
        if score_keys:
            twin = ax.twinx()
            twin.plot(x, [row[score_keys[0]] for row in rows], "s--", color="tab:blue")
            twin.set_ylabel(score_keys[0].removeprefix("mean_"), color="tab:blue")
            twin.ticklabel_format(axis="y", useOffset=False)
    return save_figure(figure, path)


def option_rows(records: Iterable[dict], base: str, metric: str = LOSS_METRIC, seed: int = 0) -> list[dict]:
    """Rows of a one-option-at-a-time ablation (``ablate.py --sweeps options``): for each recorded variant
    ``base@change``, its mean ``metric`` and its paired difference from ``base`` on their common examples
    (95% BCa bootstrap interval; on how many examples the variant is higher). The base comes first."""
    records = [r for r in records if "skipped" not in r]
    variants = list(dict.fromkeys(r["attack"] for r in records if r["attack"].startswith(f"{base}@")))
    compared = {c["attack"]: c for c in paired_comparisons(records, [(v, base) for v in variants], metric, seed=seed)}
    rows = []
    for attack in (base, *variants):
        values = [v for r in records if r["attack"] == attack and (v := metric_value(r, metric)) is not None]
        if not values:
            continue
        row = {"attack": attack, "examples": len(values), f"mean_{metric}": statistics.fmean(values)}
        if attack in compared:
            c = compared[attack]
            row[f"minus_{base}"] = f"{c['mean_difference']:+.3f} {interval_text(c['ci_low'], c['ci_high'])}"
            row["higher_on"] = f"{c['higher']}/{c['examples']}"
        rows.append(row)
    return rows
