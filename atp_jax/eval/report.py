"""Summaries of result records: one row per attack, the figures the paper's tables report."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

REFERENCE_ATTACK = "best_of_k"


def summarize(records: Iterable[dict], reference: str = REFERENCE_ATTACK) -> list[dict]:
    """Per attack: examples, mean true loss, mean of each score, how often it beats ``reference`` on the
    same example (strictly higher loss), mean forward/backward calls and seconds."""
    by_attack: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_attack[r["attack"]].append(r)
    ref_loss = {r["id"]: r["answer_loss"] for r in by_attack.get(reference, [])}
    rows = []
    for attack, recs in by_attack.items():
        row = {
            "attack": attack,
            "examples": len(recs),
            "mean_loss": statistics.fmean(r["answer_loss"] for r in recs),
            "forward_calls": statistics.fmean(r["queries"] for r in recs),
            "backward_calls": statistics.fmean(r.get("backward_calls", 0) for r in recs),
            "seconds": statistics.fmean(r["seconds"] for r in recs),
        }
        for metric in sorted({m for r in recs for m in r.get("scores", {})}):
            values = [r["scores"][metric] for r in recs if r["scores"].get(metric) is not None]
            row[metric] = statistics.fmean(values) if values else float("nan")
        paired = [r for r in recs if r["id"] in ref_loss]
        if attack != reference and paired:
            row[f"beats_{reference}"] = f"{sum(r['answer_loss'] > ref_loss[r['id']] for r in paired)}/{len(paired)}"
        rows.append(row)
    return rows


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no records)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
