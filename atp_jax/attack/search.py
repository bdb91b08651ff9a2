"""Gradient-guided swap search (beyond the paper, in the spirit of GCG), its controls, and the swap-rank
diagnostic that tells whether the gradient carries signal at all.

At a hard order (P_r, P_c) the gradient G = ∂loss/∂D of the one-hot slot-major matrices predicts the
change of swapping slots a and b to first order:

    Δ(a, b) ≈ G[a, σ(b)] + G[b, σ(a)] − G[a, σ(a)] − G[b, σ(b)]

The search ranks every row and column swap by Δ, evaluates the top ``candidates`` in one batched
forward and moves to the best if it improves; if none does, the next-ranked batch is tried from the
same gradient. The controls rank by −Δ (``reversed``) or at random (``random``) with the same budget.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from atp_jax.attack.baselines import random_orders
from atp_jax.attack.config import DIRECTIONS, AttackConfig
from atp_jax.attack.hungarian import perm_to_matrix
from atp_jax.attack.problem import ProblemTensors, answer_logits, objective_value, relaxed_positions, soft_body
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.attack.sinkhorn import pin_header
from atp_jax.models.modeling import Transformer


@dataclasses.dataclass(frozen=True)
class SearchConfig(AttackConfig):
    """Gradient-guided swap search.

    n_attack: gradient evaluations at most.
    candidates: swaps evaluated per batch (one batched forward).
    direction: ``gradient``; or a control: ``reversed`` (rank swaps by −Δ) or ``random`` (rank at random).
    start_samples: random orders scored before the search; it starts from the best of them and the
      identity (0: start from the identity).
    """

    method: ClassVar[str] = "search"
    choices: ClassVar[dict[str, tuple]] = {"direction": DIRECTIONS}
    positive: ClassVar[tuple[str, ...]] = ("n_attack", "candidates")

    n_attack: int = 2
    candidates: int = 8
    direction: str = "gradient"
    start_samples: int = 0


def order_gradients(
    evaluator: Evaluator, row_perm, col_perm, positions: str = "hard"
) -> tuple[float, np.ndarray, np.ndarray]:
    """(loss, ∂loss/∂D_r ``[n, n]``, ∂loss/∂D_c ``[m, m]``) at the hard order (one forward + backward, not
    counted here). ``positions="soft"``: the relaxation's positions follow D (``problem.soft_positions``)."""
    problem = evaluator.problem
    rows, cols = problem.padded_orders(row_perm, col_perm)
    value, g_r, g_c = evaluator.compute(
        _order_gradients, jnp.asarray(rows), jnp.asarray(cols), objective=problem.objective, positions=positions
    )
    n, m = problem.n_rows, problem.n_cols
    return float(value), np.asarray(g_r)[:n, :n], np.asarray(g_c)[:m, :m]


@functools.partial(jax.jit, static_argnames=("objective", "positions"))
def _order_gradients(
    model: Transformer, t: ProblemTensors, row_perm, col_perm, objective: str = "ce", positions: str = "hard"
):
    """(loss, ∂loss/∂D_r ``[N1-1, N1-1]``, ∂loss/∂D_c ``[M, M]``) at a padded hard order."""

    def loss(D_r, D_c):
        body = soft_body(t, pin_header(D_r), D_c, row_perm, col_perm)
        ids = relaxed_positions(t, pin_header(D_r), D_c, row_perm, col_perm, float(positions == "soft"))
        return objective_value(t, answer_logits(model, t, body[None], ids[None]), objective)[0]

    value, (g_r, g_c) = jax.value_and_grad(loss, argnums=(0, 1))(perm_to_matrix(row_perm), perm_to_matrix(col_perm))
    return value, g_r, g_c


def predicted_swap_gains(G: np.ndarray, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First-order gain of every slot swap: (pairs ``[K, 2]`` with a < b, gains ``[K]``)."""
    k = len(perm)
    a, b = np.triu_indices(k, 1)
    gains = G[a, perm[b]] + G[b, perm[a]] - G[a, perm[a]] - G[b, perm[b]]
    return np.stack([a, b], 1), gains


def _swap(perm: np.ndarray, a: int, b: int) -> np.ndarray:
    out = perm.copy()
    out[a], out[b] = out[b], out[a]
    return out


def _candidates(rows, cols, g_r, g_c, cfg: SearchConfig, rng):
    """All single swaps of the current order as (row_perm, col_perm, score), best-scored first."""
    moves = []
    if cfg.mode in ("row", "joint") and len(rows) > 1:
        pairs, gains = predicted_swap_gains(g_r, rows)
        moves += [(_swap(rows, a, b), cols, s) for (a, b), s in zip(pairs, gains)]
    if cfg.mode in ("col", "joint") and len(cols) > 1:
        pairs, gains = predicted_swap_gains(g_c, cols)
        moves += [(rows, _swap(cols, a, b), s) for (a, b), s in zip(pairs, gains)]
    if cfg.direction == "reversed":
        moves = [(r, c, -s) for r, c, s in moves]
    elif cfg.direction == "random":
        moves = [(r, c, s) for (r, c, _), s in zip(moves, rng.standard_normal(len(moves)))]
    return sorted(moves, key=lambda move: -move[2])


def search_attack(evaluator: Evaluator, cfg: SearchConfig, rng: np.random.Generator) -> AttackResult:
    """Gradient-guided swap search with ``cfg.n_attack`` gradient evaluations at most."""
    rows, cols = evaluator.identity
    best_loss = None
    if cfg.start_samples:
        sample_r, sample_c = random_orders(evaluator, rng, cfg.start_samples, cfg.mode)
        start_r = np.concatenate([rows[None], sample_r])
        start_c = np.concatenate([cols[None], sample_c])
        losses = evaluator.losses(start_r, start_c)
        rows, cols, best_loss = start_r[losses.argmax()], start_c[losses.argmax()], float(losses.max())
    seen = {(tuple(rows), tuple(cols))}
    # The same query budget whatever the direction, so the controls get exactly as many forwards.
    budget = cfg.start_samples + cfg.n_attack * (cfg.candidates + 1)
    history, ranked, gradient_steps = [], [], 0
    while evaluator.queries < budget:
        if not ranked:
            if gradient_steps == cfg.n_attack:
                break
            value, g_r, g_c = order_gradients(evaluator, rows, cols)
            evaluator.queries += 1
            evaluator.backward_calls += 1
            gradient_steps += 1
            best_loss = value
            ranked = [
                mv for mv in _candidates(rows, cols, g_r, g_c, cfg, rng) if (tuple(mv[0]), tuple(mv[1])) not in seen
            ]
            if not ranked:
                break
        size = max(1, min(cfg.candidates, budget - evaluator.queries))
        batch, ranked = ranked[:size], ranked[size:]
        seen.update((tuple(r), tuple(c)) for r, c, _ in batch)
        losses = evaluator.losses([r for r, _, _ in batch], [c for _, c, _ in batch])
        top = int(np.argmax(losses))
        history.append({"current": best_loss, "best_candidate": float(losses[top])})
        if losses[top] > best_loss:
            rows, cols, best_loss = batch[top][0], batch[top][1], float(losses[top])
            ranked = []  # moved: take a fresh gradient at the new order
    return evaluator.result(cfg.method, rows, cols, {"steps": history})


def swap_rank_correlation(
    evaluator: Evaluator, row_perm=None, col_perm=None, decompose: bool = False, soft_positions: bool = False
) -> dict:
    """Spearman correlation between the gradient's predicted and the true objective change of every single
    row/column swap at an order (default: the original). True changes use the layout's loss (batched).

    ``decompose``: also each swap's change with every run of the body kept at the position ids it has at that
    order (``Evaluator.losses(..., anchor=...)``) — its *content* part — and so the *position shift* part, the
    change minus the content part, which a relaxation mixing cell embeddings at fixed positions cannot see.
    ``soft_positions``: also the prediction of the relaxation whose positions follow D (one more backward).
    """
    rows = evaluator.identity[0] if row_perm is None else np.asarray(row_perm)
    cols = evaluator.identity[1] if col_perm is None else np.asarray(col_perm)
    value, g_r, g_c = order_gradients(evaluator, rows, cols)
    moves = _candidates(rows, cols, g_r, g_c, SearchConfig(), None)
    true = evaluator.losses([r for r, _, _ in moves], [c for _, c, _ in moves]) - value
    predicted = np.array([s for _, _, s in moves])
    top = int(np.argmax(predicted))
    stats = {
        "spearman": _spearman(predicted, true),
        "swaps": len(moves),
        "gain_of_top_predicted_swap": float(true[top]),
        "best_true_gain": float(true.max()),
        "mean_true_gain": float(true.mean()),
    }
    if soft_positions:
        _, g_r, g_c = order_gradients(evaluator, rows, cols, positions="soft")
        predicted_soft = _predicted(moves, rows, cols, g_r, g_c)
        top_soft = int(np.argmax(predicted_soft))
        stats |= {
            "spearman_soft_positions": _spearman(predicted_soft, true),
            "gain_of_top_predicted_swap_soft_positions": float(true[top_soft]),
        }
    if decompose:
        content = evaluator.losses([r for r, _, _ in moves], [c for _, c, _ in moves], anchor=(rows, cols)) - value
        shift = true - content
        stats |= {
            "mean_abs_change": float(np.abs(true).mean()),
            "mean_abs_content": float(np.abs(content).mean()),
            "mean_abs_shift": float(np.abs(shift).mean()),
            # the share of the changes' spread that position shifts alone account for
            "shift_share": float(np.sum(shift**2) / max(np.sum(shift**2) + np.sum(content**2), 1e-30)),
            "spearman_change_content": _spearman(content, true),
            "spearman_predicted_content": _spearman(predicted, content),
        }
    return stats


def _predicted(moves, rows, cols, g_r, g_c) -> np.ndarray:
    """The first-order gain (``predicted_swap_gains``) under gradients ``g_r``, ``g_c`` of each single-swap move
    ``(rows', cols', _)``, in the moves' order."""
    gains = {}
    for axis, g, perm in (("row", g_r, rows), ("col", g_c, cols)):
        if len(perm) > 1:
            pairs, values = predicted_swap_gains(g, perm)
            gains |= {(axis, int(a), int(b)): float(v) for (a, b), v in zip(pairs, values)}
    out = []
    for r, c, _ in moves:
        changed_r = np.flatnonzero(r != rows)
        axis, (a, b) = ("row", changed_r) if len(changed_r) else ("col", np.flatnonzero(c != cols))
        out.append(gains[(axis, int(a), int(b))])
    return np.array(out)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(scipy.stats.spearmanr(a, b).statistic) if len(a) > 2 else float("nan")
