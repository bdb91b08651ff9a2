"""``attack(model, example, config)``: the one call that runs any registered attack method on one example."""

from __future__ import annotations

import dataclasses

import numpy as np

from atp_jax.attack import registry
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.presets import preset
from atp_jax.attack.problem import AttackInputError, make_problem
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.models.loading import LoadedModel
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example


def attack(
    model: LoadedModel,
    example: Example,
    config: AttackConfig | None = None,
    style: PromptStyle = PromptStyle(),
    name: str | None = None,
    problem=None,
) -> AttackResult:
    """Finds an adversarial order of ``example``'s table for ``model``.

    ``config`` is any registered method's config (default: the ``atp_joint`` preset); ``name`` labels the
    result (default: the method's name). ``problem`` (from ``make_problem``) can be passed to share one
    example's precomputation between several attacks; it must match the objective and style. Raises
    ``AttackInputError`` for examples that cannot be attacked (too small, over the context, no reference
    answer in CE mode).
    """
    config = preset("atp_joint") if config is None else config
    method = registry.method_of(config)
    check_mode(example, config)
    if problem is None:
        problem = make_problem(model, example, style, config.objective)
    elif problem.objective != config.objective or problem.style != style:
        raise ValueError("the given problem was made for another objective or prompt style")
    evaluator = Evaluator(model, problem)
    result = method.run(evaluator, config, np.random.default_rng(config.seed))
    return dataclasses.replace(result, method=name or config.method)


def check_mode(example: Example, config: AttackConfig) -> None:
    """Raises ``AttackInputError`` when the dimension ``config.mode`` permutes has a single entry."""
    if config.mode == "row" and example.table.n_rows < 2:
        raise AttackInputError(f"example {example.id!r} has one data row: nothing to permute in mode 'row'")
    if config.mode == "col" and example.table.n_cols < 2:
        raise AttackInputError(f"example {example.id!r} has one column: nothing to permute in mode 'col'")
