"""Non-gradient attacks with the paper's settings: identity, random, best-of-k, reversals, evolution.

Each method has its config (an ``AttackConfig``) and a ``run(evaluator, config, rng)`` that queries the
``Evaluator`` (which counts every sequence forwarded) and returns an ``AttackResult``. "Strongest" always
means highest objective (CE of the reference answer, or KL).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from atp_jax.attack.config import AttackConfig
from atp_jax.attack.result import AttackResult, Evaluator


@dataclasses.dataclass(frozen=True)
class VanillaConfig(AttackConfig):
    """The original order (one query, for a like-for-like call count)."""

    method: ClassVar[str] = "vanilla"


@dataclasses.dataclass(frozen=True)
class RandomConfig(AttackConfig):
    """One random order of the dimensions ``mode`` permutes."""

    method: ClassVar[str] = "random"


@dataclasses.dataclass(frozen=True)
class BestOfKConfig(AttackConfig):
    """The strongest of ``k`` random orders (k queries)."""

    method: ClassVar[str] = "best_of_k"
    positive: ClassVar[tuple[str, ...]] = ("k",)
    k: int = 20


@dataclasses.dataclass(frozen=True)
class RowReverseConfig(AttackConfig):
    """Data rows in reverse order (the header stays first)."""

    method: ClassVar[str] = "row_reverse"


@dataclasses.dataclass(frozen=True)
class ColReverseConfig(AttackConfig):
    """Columns in reverse order."""

    method: ClassVar[str] = "col_reverse"


@dataclasses.dataclass(frozen=True)
class EvolutionConfig(AttackConfig):
    """The paper's E-Search: ``population · (generations + 1)`` queries."""

    method: ClassVar[str] = "evolution"
    positive: ClassVar[tuple[str, ...]] = ("population",)
    population: int = 5
    generations: int = 5


def _modes(mode: str) -> tuple[bool, bool]:
    if mode not in ("row", "col", "joint"):
        raise ValueError(f"mode must be 'row', 'col' or 'joint', got {mode!r}")
    return mode in ("row", "joint"), mode in ("col", "joint")


def random_orders(evaluator: Evaluator, rng: np.random.Generator, k: int, mode: str = "joint"):
    """``k`` random orders ``([k, n], [k, m])``; the dimensions the mode leaves alone stay identity."""
    rows_on, cols_on = _modes(mode)
    n, m = evaluator.problem.n_rows, evaluator.problem.n_cols
    rows = [rng.permutation(n) if rows_on else np.arange(n) for _ in range(k)]
    cols = [rng.permutation(m) if cols_on else np.arange(m) for _ in range(k)]
    return np.array(rows, np.int64).reshape(k, n), np.array(cols, np.int64).reshape(k, m)


def identity(evaluator: Evaluator, rng: np.random.Generator, mode: str = "joint") -> AttackResult:
    del rng, mode
    rows, cols = evaluator.identity
    evaluator.query_one(rows, cols)  # one query: the clean order, for a like-for-like call count
    return evaluator.result("vanilla", rows, cols)


def random_order(evaluator: Evaluator, rng: np.random.Generator, mode: str = "joint") -> AttackResult:
    rows, cols = random_orders(evaluator, rng, 1, mode)
    evaluator.query_one(rows[0], cols[0])
    return evaluator.result("random", rows[0], cols[0])


def best_of_k(evaluator: Evaluator, rng: np.random.Generator, k: int = 20, mode: str = "joint") -> AttackResult:
    """The strongest of ``k`` random orders (k model calls)."""
    rows, cols = random_orders(evaluator, rng, k, mode)
    losses = evaluator.losses(rows, cols)
    best = int(np.argmax(losses))
    return evaluator.result(f"best_of_{k}", rows[best], cols[best], {"losses": losses.tolist()})


def reverse(evaluator: Evaluator, rng: np.random.Generator, axis: str) -> AttackResult:
    """Data rows (``axis='row'``) or columns (``'col'``) in reverse order."""
    del rng
    rows, cols = evaluator.identity
    if axis == "row":
        rows = rows[::-1]
    elif axis == "col":
        cols = cols[::-1]
    else:
        raise ValueError(f"axis must be 'row' or 'col', got {axis!r}")
    evaluator.query_one(rows, cols)
    return evaluator.result(f"{axis}_reverse", rows, cols)


def order_crossover(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """OX1: a slice of parent ``a`` kept in place, the rest filled in parent ``b``'s order."""
    k = len(a)
    if k < 2:
        return a.copy()
    i, j = sorted(rng.choice(k + 1, 2, replace=False))
    child = -np.ones(k, a.dtype)
    child[i:j] = a[i:j]
    child[child < 0] = [x for x in b if x not in set(a[i:j])]
    return child


def swap_mutation(perm: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    perm = perm.copy()
    if len(perm) >= 2:
        i, j = rng.choice(len(perm), 2, replace=False)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def evolution(
    evaluator: Evaluator,
    rng: np.random.Generator,
    population: int = 5,
    generations: int = 5,
    mode: str = "joint",
    seeds: tuple[np.ndarray, np.ndarray] | None = None,
    name: str = "evolution",
) -> AttackResult:
    """Evolutionary search (paper's E-Search): population seeded with identity + random orders, elitism,
    order crossover and swap mutation; ``population · (generations + 1)`` model calls (30 by default).

    seeds: orders ``([s, n], [s, m])``, ``s < population``, that take the place of the first random ones.
    """
    rows_on, cols_on = _modes(mode)
    ident_r, ident_c = evaluator.identity
    seed_r, seed_c = seeds if seeds is not None else (ident_r[None, :][:0], ident_c[None, :][:0])
    if len(seed_r) >= population:
        raise ValueError(f"{len(seed_r)} seed orders leave no room for the identity in a population of {population}")
    rand_r, rand_c = random_orders(evaluator, rng, population - 1 - len(seed_r), mode)
    pop_r = np.concatenate([ident_r[None], seed_r, rand_r])
    pop_c = np.concatenate([ident_c[None], seed_c, rand_c])
    fitness = evaluator.losses(pop_r, pop_c)
    history = [float(fitness.max())]
    for _ in range(generations):
        order = np.argsort(-fitness)
        parents = order[: max(2, population // 2)]
        kids_r, kids_c = [], []
        for _ in range(population):
            a, b = rng.choice(parents, 2, replace=False)
            kid_r = order_crossover(pop_r[a], pop_r[b], rng) if rows_on else ident_r
            kid_c = order_crossover(pop_c[a], pop_c[b], rng) if cols_on else ident_c
            # Mutate the permuted dimension(s); in joint mode pick one at random.
            if rows_on and (not cols_on or rng.random() < 0.5):
                kid_r = swap_mutation(kid_r, rng)
            else:
                kid_c = swap_mutation(kid_c, rng)
            kids_r.append(kid_r)
            kids_c.append(kid_c)
        kid_fitness = evaluator.losses(np.stack(kids_r), np.stack(kids_c))
        # Elitism: the best `population` of parents and children survive.
        all_r = np.concatenate([pop_r, np.stack(kids_r)])
        all_c = np.concatenate([pop_c, np.stack(kids_c)])
        all_f = np.concatenate([fitness, kid_fitness])
        keep = np.argsort(-all_f)[:population]
        pop_r, pop_c, fitness = all_r[keep], all_c[keep], all_f[keep]
        history.append(float(fitness.max()))
    best = int(np.argmax(fitness))
    return evaluator.result(name, pop_r[best], pop_c[best], {"best_per_generation": history})


# --------------------------------------------------------------------- the registry's entry points


def run_vanilla(evaluator: Evaluator, config: VanillaConfig, rng: np.random.Generator) -> AttackResult:
    return identity(evaluator, rng, config.mode)


def run_random(evaluator: Evaluator, config: RandomConfig, rng: np.random.Generator) -> AttackResult:
    return random_order(evaluator, rng, config.mode)


def run_best_of_k(evaluator: Evaluator, config: BestOfKConfig, rng: np.random.Generator) -> AttackResult:
    return best_of_k(evaluator, rng, config.k, config.mode)


def run_row_reverse(evaluator: Evaluator, config: RowReverseConfig, rng: np.random.Generator) -> AttackResult:
    return reverse(evaluator, rng, "row")


def run_col_reverse(evaluator: Evaluator, config: ColReverseConfig, rng: np.random.Generator) -> AttackResult:
    return reverse(evaluator, rng, "col")


def run_evolution(evaluator: Evaluator, config: EvolutionConfig, rng: np.random.Generator) -> AttackResult:
    return evolution(evaluator, rng, config.population, config.generations, config.mode)
