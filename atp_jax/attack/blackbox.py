"""The gradient-free attacks against a victim behind a server: the ``Evaluator`` interface over ``ServerVictim``.

Every method that needs only the objective of hard orders (vanilla, random, best-of-k, reversals, evolution)
runs unchanged on a ``ServerEvaluator``. The objective is the reference answer's CE when the server returns
log-probabilities, and otherwise ``1 - score`` of the model's answer (``score_fn``: the dataset's metric or the
judge, in [0, 1]), so that "strongest" still means highest.

An order is queried once per example: a repeated order (evolution's survivors, the original order measured for
the result) is answered from the evaluator's memory and costs no query; ``query_budget`` caps the queries one
attack may spend on one example.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from atp_jax.attack.config import AttackConfig
from atp_jax.attack.problem import AttackInputError
from atp_jax.attack.registry import method_of
from atp_jax.attack.result import AttackResult, Oracle
from atp_jax.inference.server import ServerVictim
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example

ScoreFn = Callable[[Example, Sequence[str]], Sequence[float]]  # answers -> their scores in [0, 1]


class QueryBudgetExceeded(AttackInputError):
    """An attack that would send more queries than ``--victim_query_budget`` allows for one example."""


@dataclasses.dataclass(frozen=True)
class BlackBoxProblem:
    """One example put to a server victim: what the attacks read of a problem (its sizes and example)."""

    example: Example
    style: PromptStyle
    objective: str  # "ce" (log-probabilities) or "score" (1 - the answer's score)

    @property
    def n_rows(self) -> int:
        return self.example.table.n_rows

    @property
    def n_cols(self) -> int:
        return self.example.table.n_cols


class ServerEvaluator(Oracle):
    """Objective of hard orders on a ``ServerVictim``, each distinct order queried once and counted.

    ``queries``: distinct orders sent (a query is one order, as in process; with the ``forced`` endpoint it is one
    request per answer token). ``predictions`` keeps the answer of each order under the ``score`` objective.
    """

    backward_calls = 0

    def __init__(
        self,
        victim: ServerVictim,
        problem: BlackBoxProblem,
        score_fn: ScoreFn | None = None,
        max_new_tokens: int = 32,
        query_budget: int | None = None,
    ):
        if problem.objective == "score" and score_fn is None:
            raise ValueError("the score objective needs score_fn (the answer's metric in [0, 1])")
        self.victim, self.problem, self.score_fn = victim, problem, score_fn
        self.max_new_tokens, self.query_budget = max_new_tokens, query_budget
        self.queries = 0
        self.start = time.perf_counter()
        self.predictions: dict[tuple, str] = {}
        self._values: dict[tuple, float] = {}

    def losses(self, row_perms, col_perms) -> np.ndarray:
        """Objective ``[B]`` of hard orders ``[B, n]``, ``[B, m]``; orders measured before are not sent again."""
        keys = _keys(row_perms, col_perms, self.problem.n_rows, self.problem.n_cols)
        todo = [k for k in dict.fromkeys(keys) if k not in self._values]
        if self.query_budget is not None and self.queries + len(todo) > self.query_budget:
            raise QueryBudgetExceeded(
                f"example {self.problem.example.id!r}: the attack asks for {self.queries + len(todo)} queries, over "
                f"the budget of {self.query_budget} per example (--victim_query_budget)"
            )
        self._measure(todo)
        self.queries += len(todo)
        return np.array([self._values[k] for k in keys])

    def true_losses(self, row_perms, col_perms) -> np.ndarray:
        """The same objective, not counted as search queries: the server's prompt is already the re-rendered text."""
        keys = _keys(row_perms, col_perms, self.problem.n_rows, self.problem.n_cols)
        self._measure([k for k in dict.fromkeys(keys) if k not in self._values])
        return np.array([self._values[k] for k in keys])

    def _measure(self, keys: list[tuple]) -> None:
        if not keys:
            return
        example, style = self.problem.example, self.problem.style
        tables = [example.table.permute(rows, cols) for rows, cols in keys]
        if self.problem.objective == "ce":
            values = self.victim.answer_losses(example, tables, style)
        else:
            answers = self.victim.answers(example, tables, style, self.max_new_tokens)
            self.predictions.update(zip(keys, answers))
            values = [1.0 - float(s) for s in self.score_fn(example, answers)]
        self._values.update(zip(keys, map(float, values)))


def _keys(row_perms, col_perms, n: int, m: int) -> list[tuple]:
    rows = np.asarray(row_perms, np.int64).reshape(-1, n)
    cols = np.asarray(col_perms, np.int64).reshape(-1, m)
    return [(tuple(map(int, r)), tuple(map(int, c))) for r, c in zip(rows, cols)]


def attack_server(
    victim: ServerVictim,
    example: Example,
    config: AttackConfig,
    style: PromptStyle = PromptStyle(),
    *,
    name: str | None = None,
    score_fn: ScoreFn | None = None,
    max_new_tokens: int = 32,
    query_budget: int | None = None,
) -> tuple[AttackResult, ServerEvaluator]:
    """Runs a gradient-free attack ``config`` on ``example`` against ``victim``; the result and its evaluator
    (which holds the answers it saw). Raises ``AttackInputError`` for what cannot run (a gradient method, a table
    with nothing to permute, a budget too small) and ``VictimError`` when the server fails."""
    method = method_of(config)
    if method.uses_gradient:
        raise AttackInputError(
            f"attack {name or config.method!r} needs the model's gradient; a server victim answers only queries "
            "(use vanilla, random, best_of_k, row_reverse, col_reverse or evolution, or transfer orders found on an "
            "open model with atp-transfer --victim_url)"
        )
    if config.objective != "ce":
        raise AttackInputError(f"objective {config.objective!r}: a server victim is attacked on the CE or the score")
    table = example.table
    if (table.n_rows < 2 and table.n_cols < 2) or (config.mode == "row" and table.n_rows < 2):
        raise AttackInputError(f"example {example.id!r}: a {table.n_rows}x{table.n_cols} table has no order to attack")
    if config.mode == "col" and table.n_cols < 2:
        raise AttackInputError(f"example {example.id!r} has one column: nothing to permute in mode 'col'")
    objective = "ce" if victim.has_logprobs else "score"
    if objective == "ce" and not any(a.strip() for a in example.answers):
        raise AttackInputError(f"example {example.id!r} has no reference answer; its CE cannot be measured")
    problem = BlackBoxProblem(example, style, objective)
    evaluator = ServerEvaluator(victim, problem, score_fn, max_new_tokens, query_budget)
    result = method.run(evaluator, config, np.random.default_rng(config.seed))
    return dataclasses.replace(result, method=name or config.method), evaluator
