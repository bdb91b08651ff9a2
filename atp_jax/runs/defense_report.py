"""Scores under the permutation-smoothing defense: per attack and vote count, next to the undefended answer."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable

from atp_jax.runs.report import SCORE_METRICS, markdown_table, pick_metric

_DEFENSE = re.compile(r"smooth_k(\d+)")


def defense_metrics(records: Iterable[dict]) -> list[str]:
    """Score metrics recorded under ``defended`` (sorted)."""
    return sorted(
        {
            m
            for r in records
            if "skipped" not in r
            for entry in (r.get("defended") or {}).values()
            for m, v in (entry.get("scores") or {}).items()
            if v is not None
        }
    )


def defense_metric(records: Iterable[dict], requested: str | None = None) -> str:
    """``requested`` when recorded under ``defended``; by default the first of ``SCORE_METRICS`` recorded
    there, else the first recorded."""
    available = defense_metrics(records)
    return pick_metric(
        available,
        requested,
        "the defended answers",
        "run_attack.py --smoothing_k with --generate records them",
        (*SCORE_METRICS, *available),
    )


def defense_rows(records: Iterable[dict], metric: str | None = None) -> list[dict]:
    """Per attack, over its records that carry ``defended``: examples, the mean undefended ``metric`` and
    its mean under each ``smooth_kK`` (columns ``k=K`` by K), then the mean vote agreement at the largest
    K. ``metric``: as ``defense_metric``. A cell averages the records that have it (all of them, unless
    runs with different ``--smoothing_k`` were merged); none at all gives ``[]``."""
    records = [r for r in records if "skipped" not in r and r.get("defended")]
    if not records:
        return []
    metric = defense_metric(records, metric)
    ks = sorted({int(m[1]) for r in records for key in r["defended"] if (m := _DEFENSE.fullmatch(key))})
    by_attack: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_attack[r["attack"]].append(r)

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else float("nan")

    rows = []
    for attack, recs in by_attack.items():
        row = {
            "attack": attack,
            "examples": len(recs),
            "undefended": mean((r.get("scores") or {}).get(metric) for r in recs),
        }
        for k in ks:
            entries = [e for r in recs if (e := r["defended"].get(f"smooth_k{k}")) is not None]
            row[f"k={k}"] = mean((e.get("scores") or {}).get(metric) for e in entries)
        if ks:
            entries = [e for r in recs if (e := r["defended"].get(f"smooth_k{ks[-1]}")) is not None]
            row[f"agreement k={ks[-1]}"] = mean(e.get("agreement") for e in entries)
        rows.append(row)
    return rows


def defense_table(records: Iterable[dict], metric: str | None = None) -> str:
    """``defense_rows`` as a titled markdown table: rows attacks, columns undefended and k=1, k=5, …"""
    records = [r for r in records if "skipped" not in r and r.get("defended")]
    if not records:
        return "(no defended records)"
    metric = defense_metric(records, metric)
    title = f"mean {metric}: undefended vs. permutation smoothing over k random orders (majority vote)"
    return title + "\n\n" + markdown_table(defense_rows(records, metric))
