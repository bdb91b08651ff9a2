"""A cheap model as a filter for an expensive one (probe sampling), judged from two recorded best-of-k runs.

Best-of-k draws its k random orders on the host from the attack's seed and the table's sizes alone, so two runs
of the same best-of-k spec on the same questions — one per model — score the *same* k orders, and their
``trace.losses`` pair order by order. From those pairs, with no model call:

- how well the two models' order effects agree (Spearman over the k orders, per question);
- the filter: the cheap model ranks the k orders, the expensive one scores only the cheap model's top j and
  keeps the best of them; against best-of-j' random orders of the expensive model at the same cost
  (j' = j + k × the cheap model's forward cost in expensive forwards), whose expected best is exact over the
  k recorded orders (``expected_best_of``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import scipy.stats

from atp_jax.runs.report import interval_text
from atp_jax.stats import bootstrap_interval, expected_best_of

BEST_OF_K = "best_of_k"


def paired_order_losses(
    cheap: Iterable[dict], expensive: Iterable[dict], attack: str = BEST_OF_K
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per question both runs recorded ``attack`` for: (cheap losses ``[k]``, expensive losses ``[k]``) of the
    same k orders.

    Raises ValueError where the pairing cannot hold: another k or another table size (the draw would differ),
    or chosen orders that contradict the pairing (the same index chosen but different orders, or the same
    order chosen at different indices).
    """
    first = {r["id"]: r for r in cheap if r.get("attack") == attack and "skipped" not in r}
    pairs = {}
    for b in expensive:
        if b.get("attack") != attack or "skipped" in b or b["id"] not in first:
            continue
        a = first[b["id"]]
        la, lb = np.asarray(a["trace"]["losses"], float), np.asarray(b["trace"]["losses"], float)
        sizes = lambda r: (len(r["row_perm"]), len(r["col_perm"]))  # noqa: E731
        if len(la) != len(lb) or sizes(a) != sizes(b):
            raise ValueError(
                f"question {b['id']}: {attack} scored {len(la)} orders of a {sizes(a)} table in one run and "
                f"{len(lb)} of a {sizes(b)} table in the other; run both with the same attack spec and selection"
            )
        same_index = int(np.argmax(la)) == int(np.argmax(lb))
        same_order = (a["row_perm"], a["col_perm"]) == (b["row_perm"], b["col_perm"])
        if same_index != same_order:
            raise ValueError(
                f"question {b['id']}: the two runs' {attack} orders do not pair (chosen orders and their indices "
                "disagree); run both with the same --seed"
            )
        pairs[b["id"]] = (la, lb)
    return pairs


def filter_rows(
    pairs: dict[str, tuple[np.ndarray, np.ndarray]],
    keep: Iterable[int] = (1, 2, 5, 10),
    cheap_cost: float = 0.35,
    resamples: int = 2000,
    seed: int = 0,
) -> list[dict]:
    """One row per ``j`` in ``keep``: the expensive model's loss of the best of the cheap model's top j orders
    against best-of-j' random orders of the expensive model (exact expectation over the k recorded), with
    j' = ⌈j + k × cheap_cost⌉ its forward-equivalents, capped at k (noted in the row). Mean difference over
    questions with a 95% BCa interval, and how many questions the filter wins (ties: neither)."""
    ids = sorted(pairs)
    if not ids:
        return []
    k = len(pairs[ids[0]][0])
    rows = []
    for j in keep:
        if j > k:
            continue
        budget = math.ceil(j + k * cheap_cost - 1e-9)
        fair = min(budget, k)
        diffs = []
        for i in ids:
            cheap, expensive = pairs[i]
            top = np.argsort(-cheap, kind="stable")[:j]
            diffs.append(float(expensive[top].max()) - expected_best_of(expensive, fair))
        diffs = np.array(diffs)
        low, high = bootstrap_interval(diffs, resamples=resamples, seed=seed)
        rows.append(
            {
                "filter_top_j": j,
                "forward_equivalents": round(j + k * cheap_cost, 2),
                "random_best_of": f"{fair}" + ("" if fair == budget else f" (capped at k; fair: {budget})"),
                "questions": len(ids),
                "mean_gain": float(diffs.mean()),
                "interval": interval_text(low, high),
                "wins": f"{int((diffs > 0).sum())}/{len(ids)}",
            }
        )
    return rows


def order_agreement(pairs: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """Spearman correlation of the two models' losses over the shared orders, per question, and its median."""
    rho = {i: float(scipy.stats.spearmanr(a, b).statistic) for i, (a, b) in sorted(pairs.items())}
    values = np.array(list(rho.values()))
    return {
        "questions": len(rho),
        "median_spearman": float(np.median(values)) if len(values) else float("nan"),
        "positive": f"{int((values > 0).sum())}/{len(values)}",
        "per_question": rho,
    }
