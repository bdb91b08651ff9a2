"""``attack(model, example, config)``: the one call that runs any attack method on one example."""

from __future__ import annotations

import dataclasses

import numpy as np

from atp_jax.attack import baselines
from atp_jax.attack.atp import atp_attack
from atp_jax.attack.config import ATPConfig
from atp_jax.attack.problem import AttackInputError, make_problem
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.attack.search import search_attack
from atp_jax.models.loading import LoadedModel
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example


def attack(
    model: LoadedModel,
    example: Example,
    config: ATPConfig = ATPConfig(),
    style: PromptStyle = PromptStyle(),
    name: str | None = None,
    problem=None,
) -> AttackResult:
    """Finds an adversarial order of ``example``'s table for ``model``.

    ``problem`` (from ``make_problem``) can be passed to share one example's precomputation between
    several attacks; it must match the objective and style. Raises ``AttackInputError`` for examples
    that cannot be attacked (too small, over the context, no reference answer in CE mode).
    """
    if config.mode == "row" and example.table.n_rows < 2:
        raise AttackInputError(f"example {example.id!r} has one data row: nothing to permute in mode 'row'")
    if config.mode == "col" and example.table.n_cols < 2:
        raise AttackInputError(f"example {example.id!r} has one column: nothing to permute in mode 'col'")
    if problem is None:
        problem = make_problem(model, example, style, config.objective)
    elif problem.objective != config.objective or problem.style != style:
        raise ValueError("the given problem was made for another objective or prompt style")
    evaluator = Evaluator(model, problem)
    rng = np.random.default_rng(config.seed)
    name = name or config.method
    method = config.method
    if method == "atp":
        return atp_attack(evaluator, config, name)
    if method == "search":
        return search_attack(evaluator, config, rng, name)
    if method == "vanilla":
        result = baselines.identity(evaluator, rng)
    elif method == "random":
        result = baselines.random_order(evaluator, rng, config.mode)
    elif method == "best_of_k":
        result = baselines.best_of_k(evaluator, rng, config.k, config.mode)
    elif method in ("row_reverse", "col_reverse"):
        result = baselines.reverse(evaluator, rng, method.split("_")[0])
    else:
        result = baselines.evolution(evaluator, rng, config.population, config.generations, config.mode)
    return dataclasses.replace(result, method=name)
