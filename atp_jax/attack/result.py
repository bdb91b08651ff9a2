"""What every attack returns, and the counted evaluator that all of them query.

Cost is counted in *sequences forwarded*: one forward of one permuted prompt is one call. A gradient
step's backward is counted separately (``backward_calls``), since it costs about two forwards.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from atp_jax.attack.problem import AttackProblem, hard_losses, hard_losses_anchored, hard_losses_fixed_slots
from atp_jax.inference.qa import answer_losses
from atp_jax.models.loading import LoadedModel
from atp_jax.sharding import place_batch
from atp_jax.tables.table import Table


@dataclasses.dataclass(frozen=True)
class AttackResult:
    """The order an attack chose and what it cost.

    loss: the objective of the chosen order measured on the re-rendered, re-tokenized text
      (CE: ``answer_loss``; KL: the layout's KL, exact when ``layout.exact``).
    clean_loss: the same for the original order.
    trace: per-step diagnostics (objective, CE of the hard order, entropies, …), method-specific.
    queries / backward_calls: sequences forwarded / backpropagated.
    """

    method: str
    row_perm: tuple[int, ...]
    col_perm: tuple[int, ...]
    table: Table
    loss: float
    clean_loss: float
    queries: int
    backward_calls: int
    seconds: float
    trace: dict = dataclasses.field(default_factory=dict)

    @property
    def forward_equivalents(self) -> float:
        """Cost in forwards, a backward counted as two."""
        return self.queries + 2 * self.backward_calls


class Oracle:
    """What every attack method queries: the objective of hard orders for one problem, with its cost counted.

    A subclass sets ``problem`` (with ``n_rows``, ``n_cols`` and ``example``), ``queries``, ``backward_calls`` and
    ``start``, and implements ``losses`` (a search query: counted) and ``true_losses`` (the reported measurement of
    an order on re-rendered text: not counted when it repeats a query). ``Evaluator`` is the in-process model;
    ``atp_jax.attack.blackbox.ServerEvaluator`` a model behind a server.
    """

    problem: Any
    queries: int
    backward_calls: int
    start: float

    @property
    def identity(self) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(self.problem.n_rows), np.arange(self.problem.n_cols)

    def losses(self, row_perms, col_perms) -> np.ndarray:
        raise NotImplementedError

    def true_losses(self, row_perms, col_perms) -> np.ndarray:
        raise NotImplementedError

    def query_one(self, row_perm, col_perm) -> float:
        """The objective of the one order an attack settles on without searching (the original order, a reversal,
        one random order): one query, counted."""
        return float(self.losses([row_perm], [col_perm])[0])

    def result(self, method: str, row_perm, col_perm, trace: dict | None = None) -> AttackResult:
        """Measures the chosen order (and the clean one) on re-rendered text and packs the result."""
        identity = self.identity
        chosen, clean = self.true_losses([row_perm, identity[0]], [col_perm, identity[1]])
        row_perm, col_perm = tuple(map(int, row_perm)), tuple(map(int, col_perm))
        return AttackResult(
            method=method,
            row_perm=row_perm,
            col_perm=col_perm,
            table=self.problem.example.table.permute(row_perm, col_perm),
            loss=float(chosen),
            clean_loss=float(clean),
            queries=self.queries,
            backward_calls=self.backward_calls,
            seconds=time.perf_counter() - self.start,
            trace=trace or {},
        )


class Evaluator(Oracle):
    """Objective of hard orders for one problem on the in-process model, batched, with every sequence counted."""

    def __init__(self, loaded: LoadedModel, problem: AttackProblem):
        self.loaded = loaded
        self.problem = problem
        self.queries = 0
        self.backward_calls = 0
        self.start = time.perf_counter()

    def compute(self, fn, *args, **static):
        """``fn(model, tensors, *args, **static)``: every device computation an attack makes on its problem goes
        through here, so that ``atp_jax.attack.batched`` can batch it over several examples. ``fn`` is a jitted
        function whose static arguments are ``static``."""
        return fn(self.loaded.model, self.problem.tensors, *args, **static)

    def losses(self, row_perms, col_perms, anchor=None, fixed_slots: bool = False) -> np.ndarray:
        """Objective ``[B]`` of hard orders (the layout's tokens: one batched forward per chunk).

        Each chunk is padded to one of the problem's candidate batch sizes by repeating its first order; the
        repeats are dropped and not counted. ``anchor=(rows [n], cols [m])``: every run of the body keeps the
        position ids it has under that order (``problem.hard_losses_anchored``), so no token's position shifts.
        ``fixed_slots``: the orders laid out in slots as long as the longest cell (``problem.hard_losses_fixed_slots``).
        """
        if anchor is not None and fixed_slots:
            raise ValueError("losses: give anchor or fixed_slots, not both")
        row_perms = np.asarray(row_perms, np.int32).reshape(-1, self.problem.n_rows)
        col_perms = np.asarray(col_perms, np.int32).reshape(-1, self.problem.n_cols)
        batches = self.problem.candidate_batches
        anchor = None if anchor is None else self.problem.padded_orders(*anchor)
        out = []
        for start in range(0, len(row_perms), batches[-1]):
            rows, cols = row_perms[start : start + batches[-1]], col_perms[start : start + batches[-1]]
            size = next(b for b in batches if b >= len(rows))
            real = len(rows)
            rows = np.concatenate([rows, np.repeat(rows[:1], size - real, 0)])
            cols = np.concatenate([cols, np.repeat(cols[:1], size - real, 0)])
            rows, cols = self.problem.padded_orders(rows, cols)
            # the orders split over the mesh's data axis
            orders = place_batch(rows, self.loaded.mesh), place_batch(cols, self.loaded.mesh)
            if fixed_slots:
                values = self.compute(hard_losses_fixed_slots, *orders, objective=self.problem.objective)
            elif anchor is None:
                values = self.compute(hard_losses, *orders, objective=self.problem.objective)
            else:
                values = self.compute(hard_losses_anchored, *orders, *anchor, objective=self.problem.objective)
            out.append(np.asarray(values)[:real])
            self.queries += real
        return np.concatenate(out)

    def query_one(self, row_perm, col_perm) -> float:
        """One order's objective measured on the re-rendered text, which the result reports anyway: one query, and
        no forward of the layout (nor its program compiled at a batch of one) whose value nothing would read."""
        self.queries += 1
        return float(self.true_losses([row_perm], [col_perm])[0])

    def true_losses(self, row_perms, col_perms) -> np.ndarray:
        """Objective of hard orders on re-rendered text (the reported number); cached per order on the problem
        (so shared by the attacks of one example), not counted as search calls when it only re-measures an
        order the search already scored."""
        cache = self.problem.measured
        keys = [(tuple(map(int, r)), tuple(map(int, c))) for r, c in zip(row_perms, col_perms)]
        todo = [k for k in dict.fromkeys(keys) if k not in cache]
        if todo:
            if self.problem.objective == "ce":
                tables = [self.problem.example.table.permute(r, c) for r, c in todo]
                values = answer_losses(
                    self.loaded, self.problem.example, tables, self.problem.style, buckets=self.problem.buckets
                )
            else:
                values = self.losses([r for r, _ in todo], [c for _, c in todo])
                self.queries -= len(todo)  # a re-measurement, not a search query
            cache.update(zip(todo, map(float, values)))
        return np.array([cache[k] for k in keys])
