"""Choose the strongest attack on one half of the questions and confirm it on the other.

A winner picked and scored on the same questions is biased upward (the maximum of noisy means), so the choice
and its evidence come from disjoint halves. The questions recorded with the best-of-K reference in every folder
(one folder per victim) are shuffled with a seed and split; on the *choice* half every searching attack is set
against best-of-j at its own compute (``sampled_budget_rows``) in each folder, and the attack whose smallest
per-folder mean difference is largest wins — it must beat sampling on every victim, not on average. On the
*confirmation* half the winner alone is measured again, per folder, with its paired interval and the share of
questions on which it is higher; ``meets_target`` says whether it wins on at least ``target_share`` of them with
an interval clear of 0 in every folder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from atp_jax.runs.report import interval_text
from atp_jax.runs.sampled_budget import sampled_budget_rows

TARGET_SHARE = 0.6


@dataclasses.dataclass(frozen=True)
class StrongestChoice:
    """``choice_rows[attack]`` and ``confirm_rows`` hold one ``sampled_budget_rows`` row per folder, in the
    folders' order (``confirm_rows`` for ``attack`` only)."""

    attack: str
    choice_ids: tuple[str, ...]
    confirm_ids: tuple[str, ...]
    choice_rows: dict[str, list[dict]]
    confirm_rows: list[dict]
    meets_target: bool


def split_questions(ids, seed: int = 0) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The sorted ``ids`` shuffled with ``seed``, cut in two: (choice half of ⌊N/2⌋, confirmation half)."""
    ordered = sorted(set(ids))
    shuffled = [ordered[i] for i in np.random.default_rng(seed).permutation(len(ordered))]
    half = len(ordered) // 2
    return tuple(sorted(shuffled[:half])), tuple(sorted(shuffled[half:]))


def _questions_with(records: list[dict], reference: str) -> set[str]:
    return {r["id"] for r in records if r.get("attack") == reference and "skipped" not in r}


def _worst(rows: Sequence[dict]) -> float:
    """The lowest mean difference over the folders' rows: the victim the attack does worst on."""
    return min(row["mean_difference"] for row in rows)


def choose_strongest(
    record_sets: Sequence[list[dict]],
    reference: str,
    backward_costs: Sequence[float],
    split_seed: int = 0,
    target_share: float = TARGET_SHARE,
    resamples: int = 2000,
    seed: int = 0,
) -> StrongestChoice:
    """The strongest searching attack over ``record_sets`` (one list of records per victim, each with its
    ``backward_costs`` entry), chosen on one half of their common questions and confirmed on the other.
    ``ValueError`` when the folders share fewer than 4 questions with ``reference`` or no attack is recorded
    on the choice half in every folder."""
    if len(record_sets) != len(backward_costs):
        raise ValueError(f"{len(record_sets)} record sets but {len(backward_costs)} backward costs; give one per set")
    record_sets = [list(records) for records in record_sets]
    common = set.intersection(*(_questions_with(records, reference) for records in record_sets))
    if len(common) < 4:
        raise ValueError(f"{reference} is recorded on {len(common)} questions common to every folder; need ≥ 4")
    choice_ids, confirm_ids = split_questions(common, split_seed)

    def rows_on(ids) -> list[dict[str, dict]]:
        wanted = set(ids)
        return [
            {
                row["attack"]: row
                for row in sampled_budget_rows(
                    [r for r in records if r["id"] in wanted], reference, cost, resamples=resamples, seed=seed
                )
            }
            for records, cost in zip(record_sets, backward_costs)
        ]

    per_folder = rows_on(choice_ids)
    candidates = sorted(set.intersection(*(set(rows) for rows in per_folder)))
    if not candidates:
        raise ValueError("no searching attack is recorded on the choice half in every folder")
    choice_rows = {attack: [rows[attack] for rows in per_folder] for attack in candidates}
    # The worst victim decides; ties go to the cheaper attack, then to the first name.
    winner = min(
        candidates,
        key=lambda a: (
            -_worst(choice_rows[a]),
            max(row["mean_budget"] for row in choice_rows[a]),
            a,
        ),
    )
    confirm = rows_on(confirm_ids)
    missing = [i for i, rows in enumerate(confirm) if winner not in rows]
    if missing:
        raise ValueError(f"{winner} is not recorded on the confirmation half in folder(s) {missing}")
    confirm_rows = [rows[winner] for rows in confirm]
    meets = all(
        row["higher"] / row["examples"] >= target_share and not math.isnan(row["ci_low"]) and row["ci_low"] > 0
        for row in confirm_rows
    )
    return StrongestChoice(winner, choice_ids, confirm_ids, choice_rows, confirm_rows, meets)


def strongest_markdown(choice: StrongestChoice, folders: Sequence[str], target_share: float = TARGET_SHARE) -> str:
    """The choice-half table (every candidate, per folder, worst first decides) and the winner's confirmation."""
    columns = " | ".join(f"{folder}: mean − best-of-budget [95% CI], higher" for folder in folders)
    rule = "|---|" + "---|" * len(folders)

    def cells(rows):
        return " | ".join(
            f"{r['mean_difference']:+.3f} {interval_text(r['ci_low'], r['ci_high'])}, {r['higher']}/{r['examples']}"
            for r in rows
        )

    lines = [
        f"Chosen on {len(choice.choice_ids)} questions ({', '.join(choice.choice_ids)}); "
        f"confirmed on the other {len(choice.confirm_ids)}.",
        "",
        f"| attack, choice half | {columns} | worst |",
        rule + "---|",
    ]
    ranked = sorted(choice.choice_rows.items(), key=lambda item: -_worst(item[1]))
    for attack, rows in ranked:
        name = f"**{attack}**" if attack == choice.attack else attack
        lines.append(f"| {name} | {cells(rows)} | {_worst(rows):+.3f} |")
    lines += [
        "",
        f"| confirmation half | {columns} |",
        rule,
        f"| {choice.attack} | {cells(choice.confirm_rows)} |",
        "",
        f"Target (higher on ≥ {target_share:.0%} of the confirmation questions with an interval clear of 0, in every "
        f"folder): {'met' if choice.meets_target else 'not met'}.",
    ]
    return "\n".join(lines)
