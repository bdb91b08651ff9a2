"""Evidence-aware structured attacks: no gradient, the gold answer tells which cells carry the evidence.

The candidates move the evidence rows (``tables.evidence``: rows holding an answer or a key cell) together
to the front, the middle or the end of the data rows, and the answer's column first or last, every other row
and column keeping its original relative order. ``structured`` scores the first ``queries`` distinct
candidates and keeps the strongest; ``structured_evolution`` is the paper's E-Search with its population
seeded by the candidates instead of random orders (same budget). A question with no evidence found (an
aggregate "how many ...") falls back to the reversals, so every question gets an order; the trace says which.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from atp_jax.attack.baselines import EvolutionConfig, evolution
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.tables.evidence import Evidence, find_evidence

ROW_PLACEMENTS = ("end", "front", "middle")
COL_PLACEMENTS = ("last", "first")


@dataclasses.dataclass(frozen=True)
class StructuredConfig(AttackConfig):
    """The strongest of the first ``queries`` structured placements (``queries`` model calls at most)."""

    method: ClassVar[str] = "structured"
    positive: ClassVar[tuple[str, ...]] = ("queries",)
    queries: int = 5


@dataclasses.dataclass(frozen=True)
class StructuredEvolutionConfig(EvolutionConfig):
    """E-Search from the identity and up to ``population - 1`` structured placements (random orders fill the
    rest): ``population · (generations + 1)`` queries, as E-Search."""

    method: ClassVar[str] = "structured_evolution"


def move_block(n: int, block, where: str) -> np.ndarray:
    """The order of ``n`` items with ``block`` (indices, kept in their order) moved together to the
    ``front``/``first``, ``middle`` or ``end``/``last`` of the others, which keep theirs. ``[n]``."""
    block = [int(i) for i in block]
    rest = [i for i in range(n) if i not in set(block)]
    at = {"front": 0, "first": 0, "middle": len(rest) // 2, "end": len(rest), "last": len(rest)}[where]
    return np.array(rest[:at] + block + rest[at:], np.int64)


def _moves(n: int, block, placements) -> list[tuple[str, np.ndarray]]:
    """The placements of ``block`` that move something, each order once (the first name that makes it)."""
    out, seen = [], {tuple(range(n))}
    for where in placements if block else ():
        order = move_block(n, block, where)
        if tuple(order) not in seen:
            seen.add(tuple(order))
            out.append((where, order))
    return out


def candidates(evidence: Evidence, n_rows: int, n_cols: int, mode: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Distinct non-identity placements ``(name, rows [n], cols [m])`` in the order they are tried: rows and
    column moved together first (joint mode), then each alone; the reversals when evidence gives none."""
    rows_on, cols_on = mode in ("row", "joint"), mode in ("col", "joint")
    ident_r, ident_c = np.arange(n_rows), np.arange(n_cols)
    row_moves = _moves(n_rows, evidence.rows, ROW_PLACEMENTS) if rows_on else []
    col_moves = _moves(n_cols, evidence.answer_columns, COL_PLACEMENTS) if cols_on else []
    proposals = [(f"rows_{r}+col_{c}", rows, cols) for r, rows in row_moves for c, cols in col_moves]
    proposals += [(f"rows_{r}", rows, ident_c) for r, rows in row_moves]
    proposals += [(f"col_{c}", ident_r, cols) for c, cols in col_moves]
    out, seen = [], {(tuple(ident_r), tuple(ident_c))}
    for name, rows, cols in proposals:
        if (tuple(rows), tuple(cols)) not in seen:
            seen.add((tuple(rows), tuple(cols)))
            out.append((name, rows, cols))
    if not out:  # nothing located, or every move is the original order
        reversals = [("row_reverse", ident_r[::-1], ident_c)] if rows_on and n_rows > 1 else []
        reversals += [("col_reverse", ident_r, ident_c[::-1])] if cols_on and n_cols > 1 else []
        out = [r for r in reversals if (tuple(r[1]), tuple(r[2])) not in seen]
    return out


def _evidence_trace(evidence: Evidence, tried) -> dict:
    return {
        "evidence_rows": list(evidence.rows),
        "answer_columns": list(evidence.answer_columns),
        "evidence_found": evidence.found,
        "candidates": [name for name, _, _ in tried],
    }


def run_structured(evaluator: Evaluator, config: StructuredConfig, rng: np.random.Generator) -> AttackResult:
    del rng  # deterministic: the placements follow from the table and the answer
    problem = evaluator.problem
    evidence = find_evidence(problem.example)
    tried = candidates(evidence, problem.n_rows, problem.n_cols, config.mode)[: config.queries]
    rows = np.stack([r for _, r, _ in tried])
    cols = np.stack([c for _, _, c in tried])
    losses = evaluator.losses(rows, cols)
    best = int(np.argmax(losses))
    trace = {**_evidence_trace(evidence, tried), "losses": losses.tolist()}
    return evaluator.result("structured", rows[best], cols[best], trace)


def run_structured_evolution(
    evaluator: Evaluator, config: StructuredEvolutionConfig, rng: np.random.Generator
) -> AttackResult:
    problem = evaluator.problem
    evidence = find_evidence(problem.example)
    tried = candidates(evidence, problem.n_rows, problem.n_cols, config.mode)[: config.population - 1]
    seeds = (np.stack([r for _, r, _ in tried]), np.stack([c for _, _, c in tried])) if tried else None
    result = evolution(
        evaluator, rng, config.population, config.generations, config.mode, seeds=seeds, name=config.method
    )
    return dataclasses.replace(result, trace={**result.trace, **_evidence_trace(evidence, tried)})
