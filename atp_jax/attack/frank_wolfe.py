"""Frank–Wolfe proposals evaluated exactly: the gradient's linear oracle over permutations, in batches.

At a hard order the gradient ``G = ∂loss/∂D`` of the slot-major one-hot matrices makes the loss linear to
first order, ``loss(P) ≈ loss(P₀) + ⟨G, P − P₀⟩``, and the permutation maximising that linear model is one
assignment problem (SciPy's Hungarian solver): Frank–Wolfe's linear minimisation oracle, a whole reordering
rather than a swap. A first-order model is poor for moves that large, so the oracle proposes a *batch*:
its own answer and the answers for ``G`` perturbed by Gaussian noise of ``noise`` times G's spread
(perturb-and-MAP), all scored exactly in one batched forward; the search moves to the best if it improves
and takes a fresh gradient there. The controls propose from ``−G`` (``reversed``) or a random matrix of G's
norm (``random``) with the same budget. ``positions='soft'`` takes the gradient of the relaxation whose
positions follow D (``problem.soft_positions``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import scipy.optimize

from atp_jax.attack.atp import POSITIONS
from atp_jax.attack.config import DIRECTIONS, AttackConfig
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.attack.search import order_gradients


@dataclasses.dataclass(frozen=True)
class FrankWolfeConfig(AttackConfig):
    """Linear-oracle proposals: ``n_attack`` gradients, each followed by ``candidates`` orders scored as one
    batch — ``n_attack · (candidates + 1)`` forwards and ``n_attack`` backwards at most.

    noise: the perturbation's scale relative to the standard deviation of G's real entries (0: only the
      oracle's own answer, so one distinct proposal per gradient).
    """

    method: ClassVar[str] = "frank_wolfe"
    choices: ClassVar[dict[str, tuple]] = {"direction": DIRECTIONS, "positions": POSITIONS}
    positive: ClassVar[tuple[str, ...]] = ("n_attack", "candidates")

    n_attack: int = 2
    candidates: int = 9
    noise: float = 1.0
    direction: str = "gradient"
    positions: str = "hard"


def linear_oracle(G: np.ndarray) -> np.ndarray:
    """The order ``perm [k]`` (slot a holds item ``perm[a]``) maximising ``Σ_a G[a, perm[a]]``."""
    _, perm = scipy.optimize.linear_sum_assignment(G, maximize=True)
    return perm.astype(np.int64)


def _steered(G: np.ndarray, direction: str, rng: np.random.Generator) -> np.ndarray:
    if direction == "reversed":
        return -G
    if direction == "random":
        z = rng.standard_normal(G.shape)
        return z * np.linalg.norm(G) / (np.linalg.norm(z) + 1e-12)
    return G


def proposals(rows, cols, g_r, g_c, cfg: FrankWolfeConfig, rng, seen: set, size: int, first: bool) -> list:
    """Up to ``size`` distinct unseen orders ``(rows [n], cols [m])`` from the oracle on the steered, perturbed
    gradients (``first``: the first is the unperturbed oracle's answer). Tries at most 4× as many draws."""
    rows_on, cols_on = cfg.mode in ("row", "joint"), cfg.mode in ("col", "joint")
    g_r, g_c = _steered(g_r, cfg.direction, rng), _steered(g_c, cfg.direction, rng)
    out = []
    for draw in range(4 * size):
        if len(out) == size:
            break
        scale = 0.0 if first and draw == 0 else cfg.noise
        new_r = linear_oracle(g_r + scale * g_r.std() * rng.standard_normal(g_r.shape)) if rows_on else rows
        new_c = linear_oracle(g_c + scale * g_c.std() * rng.standard_normal(g_c.shape)) if cols_on else cols
        key = (tuple(new_r), tuple(new_c))
        if key not in seen:
            seen.add(key)
            out.append((new_r, new_c))
    return out


def frank_wolfe_attack(evaluator: Evaluator, cfg: FrankWolfeConfig, rng: np.random.Generator) -> AttackResult:
    """At most ``cfg.n_attack`` gradients; after a batch that improves nothing, another batch of proposals from
    the same gradient (fresh noise) until the forward budget is spent — the controls spend the same."""
    rows, cols = evaluator.identity
    seen = {(tuple(rows), tuple(cols))}
    budget = cfg.n_attack * (cfg.candidates + 1)
    history, gradient, gradient_steps, value = [], None, 0, None
    while evaluator.queries < budget:
        first = gradient is None
        if first:
            if gradient_steps == cfg.n_attack:
                break
            value, g_r, g_c = order_gradients(evaluator, rows, cols, positions=cfg.positions)
            evaluator.queries += 1
            evaluator.backward_calls += 1
            gradient_steps += 1
            gradient = g_r, g_c
        size = max(1, min(cfg.candidates, budget - evaluator.queries))
        batch = proposals(rows, cols, *gradient, cfg, rng, seen, size, first)
        if not batch:
            break  # the oracle keeps returning orders already scored
        losses = evaluator.losses([r for r, _ in batch], [c for _, c in batch])
        top = int(np.argmax(losses))
        history.append({"current": float(value), "best_candidate": float(losses[top]), "proposed": len(batch)})
        if losses[top] > value:
            (rows, cols), value, gradient = batch[top], float(losses[top]), None  # moved: a fresh gradient there
    return evaluator.result(cfg.method, rows, cols, {"steps": history})
