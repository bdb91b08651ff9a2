"""Every searching attack against best-of-j random orders at its own compute, from one large best-of-K record.

A best-of-K run records the loss of each of its K random orders (``trace.losses``). Best-of-j for any j ≤ K is
then known in expectation, exactly, from those K losses (``stats.expected_best_of``), so one run of
``best_of_k@k=K`` stands in for a best-of-k run at every smaller budget: no run per budget, and an estimate with
less variance than one draw of j orders. Each question gets its own budget: the attack's compute *on that
question* in forwards (queries + ``backward_cost`` × backward calls), rounded up, so best-of-j is never given
less than the attack spent. A question whose budget exceeds K is left out and counted.

The comparison is of the reference answer's loss (``answer_loss``), the quantity best-of-k maximises; scores of
generated answers need a generation under each order and stay with the recorded best-of-k runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from atp_jax.attack import registry
from atp_jax.attack.presets import attack_config, preset
from atp_jax.runs.report import LOSS_METRIC, forward_cost, interval_text
from atp_jax.stats import bootstrap_interval, expected_best_of


def _reference_losses(records: list[dict], reference: str) -> tuple[int, dict[str, np.ndarray]]:
    """K and each question's K recorded losses of the ``reference`` best-of-k spec."""
    try:
        config = preset(reference)
    except ValueError as e:
        raise ValueError(f"reference {reference!r}: {e}") from None
    if config.method != "best_of_k":
        raise ValueError(f"reference {reference!r} is a {config.method} attack; it must be a best_of_k spec")
    losses = {}
    for r in records:
        if r.get("attack") == reference and "skipped" not in r:
            values = np.asarray((r.get("trace") or {}).get("losses", []), float)
            if len(values) != config.k:
                raise ValueError(
                    f"question {r['id']}: {reference} recorded {len(values)} order losses, not {config.k}; "
                    "it was recorded without its trace"
                )
            losses[r["id"]] = values
    return config.k, losses


def _searching(attack: str) -> bool:
    config = attack_config(attack)
    return config is not None and config.method != "best_of_k" and registry.method_of(config).searches


def sampled_budget_rows(
    records: Iterable[dict],
    reference: str,
    backward_cost: float,
    resamples: int = 2000,
    seed: int = 0,
) -> list[dict]:
    """Per searching attack recorded with ``reference`` on common questions: the mean per-question difference
    of ``answer_loss`` (attack − expected best-of-j_q of the reference's K losses, j_q the attack's rounded-up
    compute on question q) with its 95% BCa interval, on how many questions the attack is higher, the mean
    budget and how many questions were over K. ``ValueError`` when ``reference`` is not a recorded best-of-k
    with its order losses."""
    records = list(records)
    k, reference_losses = _reference_losses(records, reference)
    if not reference_losses:
        raise ValueError(f"{reference} is not recorded in these records")
    by_attack: dict[str, list[dict]] = {}
    for r in records:
        if "skipped" not in r and r.get(LOSS_METRIC) is not None and r["id"] in reference_losses:
            by_attack.setdefault(r["attack"], []).append(r)
    rows = []
    for attack, attack_records in by_attack.items():
        if not _searching(attack):
            continue
        diffs, budgets, over = [], [], 0
        for r in attack_records:
            if "queries" not in r:
                continue  # recorded before calls were counted: no budget to match
            budget = math.ceil(forward_cost(r, backward_cost) - 1e-9)
            if budget > k:
                over += 1
                continue
            budgets.append(budget)
            diffs.append(r[LOSS_METRIC] - expected_best_of(reference_losses[r["id"]], max(budget, 1)))
        if not diffs:
            continue
        diffs = np.array(diffs)
        low, high = bootstrap_interval(diffs, resamples=resamples, seed=seed)
        rows.append(
            {
                "attack": attack,
                "examples": len(diffs),
                "mean_budget": float(np.mean(budgets)),
                "mean_difference": float(diffs.mean()),
                "ci_low": low,
                "ci_high": high,
                "higher": int((diffs > 0).sum()),
                "over_budget": over,
            }
        )
    return rows


def sampled_budget_markdown(rows: list[dict], reference: str) -> str:
    """The rows as markdown: attack, questions, mean budget, mean loss difference [95% CI], higher on."""
    lines = [
        f"| attack | examples | mean budget (forwards) | mean {LOSS_METRIC} − best-of-budget from {reference} "
        "[95% CI] | higher on | over K |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['attack']} | {r['examples']} | {r['mean_budget']:.1f} | {r['mean_difference']:+.3f} "
        f"{interval_text(r['ci_low'], r['ci_high'])} | {r['higher']}/{r['examples']} | {r['over_budget']} |"
        for r in rows
    ]
    return "\n".join(lines)
