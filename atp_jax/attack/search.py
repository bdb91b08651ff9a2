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
from atp_jax.attack.problem import ProblemTensors, answer_logits, objective_value, relaxed_positions, soft_body
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.attack.sinkhorn import pin_header
from atp_jax.models.modeling import Transformer
from atp_jax.tables.layout import fixed_slot_positions


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


POSITIONS = ("hard", "soft", "slots")


def order_gradients(
    evaluator: Evaluator, row_perm, col_perm, positions: str = "hard", at=None
) -> tuple[float, np.ndarray, np.ndarray]:
    """(loss, ∂loss/∂D_r ``[n, n]``, ∂loss/∂D_c ``[m, m]``) of the relaxation at the hard order (one forward +
    backward, not counted here), its body laid out by that order. ``positions``: ``hard`` (the order's own),
    ``soft`` (following D: ``problem.soft_positions``) or ``slots`` (fixed slots as long as the longest cell:
    ``layout.fixed_slot_positions``). ``at=(D_r [n, n], D_c [m, m])``: the gradient at those soft orders
    instead of the hard order's one-hot matrices."""
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
    problem = evaluator.problem
    rows, cols = problem.padded_orders(row_perm, col_perm)
    n, m = problem.n_rows, problem.n_cols
    if at is None:  # the order's one-hot matrices, made on the host (no extra device program)
        D_r, D_c = np.eye(len(rows), dtype=np.float32)[rows], np.eye(len(cols), dtype=np.float32)[cols]
    else:
        D_r, D_c = (_pad_identity(np.asarray(D, np.float32), len(p)) for D, p in zip(at, (rows, cols)))
    value, g_r, g_c = evaluator.compute(
        _gradients_at,
        D_r,  # host arrays: the jitted function transfers them (jnp.asarray would compile a program for each)
        D_c,
        rows,
        cols,
        objective=problem.objective,
        positions=positions,
    )
    return float(value), np.asarray(g_r)[:n, :n], np.asarray(g_c)[:m, :m]


def _pad_identity(D: np.ndarray, size: int) -> np.ndarray:
    """``D [k, k]`` in the top-left corner of a ``[size, size]`` identity: pad rows/columns stay in place."""
    out = np.eye(size, dtype=D.dtype)
    out[: len(D), : len(D)] = D
    return out


def _relaxed_loss(model: Transformer, t: ProblemTensors, D_r, D_c, row_perm, col_perm, objective, positions):
    body = soft_body(t, pin_header(D_r), D_c, row_perm, col_perm)
    if positions == "slots":
        ids = fixed_slot_positions(t.layout, row_perm, col_perm, body_length=t.body_length).astype(jnp.float32)
    else:
        ids = relaxed_positions(t, pin_header(D_r), D_c, row_perm, col_perm, positions == "soft")
    return objective_value(t, answer_logits(model, t, body[None], ids[None]), objective)[0]


@functools.partial(jax.jit, static_argnames=("objective", "positions"))
def _gradients_at(
    model: Transformer, t: ProblemTensors, D_r, D_c, row_perm, col_perm, objective: str = "ce", positions: str = "hard"
):
    """(loss, ∂loss/∂D_r ``[N1-1, N1-1]``, ∂loss/∂D_c ``[M, M]``) at soft (or one-hot) ``D_r``, ``D_c`` with the
    body laid out by the padded hard order ``row_perm``, ``col_perm``."""

    def loss(D_r, D_c):
        return _relaxed_loss(model, t, D_r, D_c, row_perm, col_perm, objective, positions)

    value, (g_r, g_c) = jax.value_and_grad(loss, argnums=(0, 1))(D_r, D_c)
    return value, g_r, g_c


def smoothed_gradients(
    evaluator: Evaluator, row_perm, col_perm, samples: int, scale: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The relaxation's gradient averaged over ``samples`` soft orders near the hard one: each
    ``(1 − scale)·P + scale·Q`` for the order's matrix P and a random permutation matrix Q (rows and columns
    drawn apart) — a gradient that sees what lies part of the way to other orders rather than only the vertex
    (``samples`` forward + backward passes, not counted here)."""
    n, m = evaluator.problem.n_rows, evaluator.problem.n_cols
    P_r, P_c = np.eye(n)[np.asarray(row_perm)], np.eye(m)[np.asarray(col_perm)]
    total_r, total_c = np.zeros((n, n)), np.zeros((m, m))
    for _ in range(samples):
        at = (
            (1 - scale) * P_r + scale * np.eye(n)[rng.permutation(n)],
            (1 - scale) * P_c + scale * np.eye(m)[rng.permutation(m)],
        )
        _, g_r, g_c = order_gradients(evaluator, row_perm, col_perm, at=at)
        total_r += g_r
        total_c += g_c
    return total_r / samples, total_c / samples


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
    evaluator: Evaluator,
    row_perm=None,
    col_perm=None,
    decompose: bool = False,
    soft_positions: bool = False,
    fixed_slots: bool = False,
    smooth_samples: int = 0,
    smooth_scale: float = 0.25,
    seed: int = 0,
) -> dict:
    """Spearman correlation between the gradient's predicted and the true objective change of every single
    row/column swap at an order (default: the original). True changes use the layout's loss (batched).

    ``decompose``: also each swap's change with every run of the body kept at the position ids it has at that
    order (``Evaluator.losses(..., anchor=...)``) — its *content* part — and so the *position shift* part, the
    change minus the content part, which a relaxation mixing cell embeddings at fixed positions cannot see.
    ``soft_positions``: also the prediction of the relaxation whose positions follow D (one more backward).
    ``fixed_slots``: also every swap's change in the fixed-slot layout (``Evaluator.losses(..., fixed_slots=True)``),
    how far that layout's losses are from the real prompt's, and the prediction of the relaxation laid out in
    it. ``smooth_samples``: also the prediction of the gradient averaged over that many soft orders near the
    order (``smoothed_gradients`` with ``smooth_scale``, random orders drawn from ``seed``).
    """
    rows = evaluator.identity[0] if row_perm is None else np.asarray(row_perm)
    cols = evaluator.identity[1] if col_perm is None else np.asarray(col_perm)
    value, g_r, g_c = order_gradients(evaluator, rows, cols)
    moves = _candidates(rows, cols, g_r, g_c, SearchConfig(), None)
    orders = [r for r, _, _ in moves], [c for _, c, _ in moves]
    true = evaluator.losses(*orders) - value
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
    if fixed_slots:
        slot_value = float(evaluator.losses([rows], [cols], fixed_slots=True)[0])
        slot_losses = evaluator.losses(*orders, fixed_slots=True)
        slot_change = slot_losses - slot_value
        _, g_r, g_c = order_gradients(evaluator, rows, cols, positions="slots")
        predicted_slots = _predicted(moves, rows, cols, g_r, g_c)
        stats |= {
            # the fixed-slot layout against the real prompt: at the order, and over every swapped order
            "fixed_slot_loss_gap": slot_value - value,
            "fixed_slot_mean_abs_gap": float(np.abs(slot_losses - (true + value)).mean()),
            "spearman_fixed_slot_change": _spearman(slot_change, true),
            "spearman_fixed_slot_predicted": _spearman(predicted_slots, slot_change),
            "spearman_fixed_slot_predicted_true": _spearman(predicted_slots, true),
            "gain_of_top_predicted_swap_fixed_slots": float(true[int(np.argmax(predicted_slots))]),
        }
    if smooth_samples:
        g_r, g_c = smoothed_gradients(evaluator, rows, cols, smooth_samples, smooth_scale, np.random.default_rng(seed))
        predicted_smooth = _predicted(moves, rows, cols, g_r, g_c)
        stats |= {
            "spearman_smoothed": _spearman(predicted_smooth, true),
            "gain_of_top_predicted_swap_smoothed": float(true[int(np.argmax(predicted_smooth))]),
        }
    if decompose:
        content = evaluator.losses(*orders, anchor=(rows, cols)) - value
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
