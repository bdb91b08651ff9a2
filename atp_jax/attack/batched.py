"""One attack on several examples of one shape bucket at once: every device computation batched over them.

Each example runs its method's own code (the same ``run(evaluator, config, rng)`` as alone) in its own
thread, against a ``PooledEvaluator``. Whenever every example still running has asked for a device
computation (``Evaluator.compute``), the pool runs them as one program vmapped over the examples —
best-of-k's candidate batches, evolution's generations, ATP's whole optimisation, search's gradients —
and hands each example its slice. The methods are unchanged, so each example's orders and losses are
those of attacking it alone with the same seed (up to float rounding of the batched matmuls).

An example that asks for something the others do not (ATP scoring the distinct orders it visited, a
search that stops early) is batched with any example asking the same; the slots of the others are filled
with a copy of its request and dropped, so the program's shape stays fixed at the group's size. The
final measurement on re-rendered text (``Evaluator.true_losses``) runs per example.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atp_jax.attack import registry
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.problem import AttackProblem
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.models.loading import LoadedModel
from atp_jax.sharding import place_batch


def bucket_key(problem: AttackProblem) -> tuple:
    """Examples whose problems share this key can be attacked as one batch (their tensors stack)."""
    leaves, treedef = jax.tree.flatten(problem.tensors)
    return problem.objective, problem.style, treedef, _signature(leaves)


@functools.cache
def _vmapped(fn, static: tuple):
    """``fn(model, tensors, *args, **static)`` vmapped over stacked tensors and arguments, jitted once."""
    kwargs = dict(static)

    def many(model, tensors, *args):
        return jax.vmap(lambda t, *a: fn(model, t, *a, **kwargs))(tensors, *args)

    return jax.jit(many)


def _stack(trees: Sequence) -> object:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _signature(args) -> tuple:
    return tuple((leaf.shape, str(leaf.dtype)) for leaf in jax.tree.leaves(args))


class ComputePool:
    """The rendezvous of a group's examples: each round runs every pending request, batched per kind."""

    def __init__(self, loaded: LoadedModel, problems: Sequence[AttackProblem]):
        keys = {bucket_key(p) for p in problems}
        if len(keys) != 1:
            raise ValueError("examples attacked together must share one shape bucket, objective and prompt style")
        self.loaded = loaded
        self.size = len(problems)
        self.tensors = _stack([p.tensors for p in problems])
        if loaded.mesh is not None:  # the examples split over the mesh's data axis
            self.tensors = jax.tree.map(lambda x: place_batch(x, loaded.mesh), self.tensors)
        self._cond = threading.Condition()
        self._active = set(range(self.size))
        self._requests: dict[int, tuple] = {}
        self._replies: dict[int, tuple[bool, object]] = {}

    def compute(self, index: int, fn, args: tuple, static: dict):
        """Runs ``fn(model, tensors_index, *args, **static)`` batched with the other examples' requests."""
        args = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else jnp.asarray(x), args)
        with self._cond:
            self._requests[index] = (fn, tuple(sorted(static.items())), args)
            if len(self._requests) == len(self._active):
                self._run_round()
            else:
                self._cond.wait_for(lambda: index in self._replies)
            ok, value = self._replies.pop(index)
        if not ok:
            raise value
        return value

    def leave(self, index: int) -> None:
        """Example ``index`` is done (or failed): rounds no longer wait for it."""
        with self._cond:
            self._active.discard(index)
            if self._requests and len(self._requests) == len(self._active):
                self._run_round()

    def _run_round(self) -> None:
        # Called with the lock held by the last example to arrive; the others are waiting for their replies.
        groups: dict[tuple, list[int]] = {}
        for index, (fn, static, args) in self._requests.items():
            groups.setdefault((fn, static, _signature(args)), []).append(index)
        for (fn, static, _), indices in groups.items():
            try:
                filler = self._requests[indices[0]][2]
                stacked = _stack([self._requests[i][2] if i in indices else filler for i in range(self.size)])
                if self.loaded.mesh is not None:
                    stacked = jax.tree.map(lambda x: place_batch(x, self.loaded.mesh), stacked)
                out = _vmapped(fn, static)(self.loaded.model, self.tensors, *stacked)
                for i in indices:
                    self._replies[i] = (True, jax.tree.map(lambda x, i=i: x[i], out))
            except Exception as error:  # every example of the group sees the failure
                for i in indices:
                    self._replies[i] = (False, error)
        self._requests.clear()
        self._cond.notify_all()


class PooledEvaluator(Evaluator):
    """An ``Evaluator`` whose device computations go through a ``ComputePool``."""

    def __init__(self, loaded: LoadedModel, problem: AttackProblem, pool: ComputePool, index: int):
        super().__init__(loaded, problem)
        self.pool = pool
        self.index = index

    def compute(self, fn, *args, **static):
        return self.pool.compute(self.index, fn, args, static)


def attack_many(
    loaded: LoadedModel,
    problems: Sequence[AttackProblem],
    config: AttackConfig,
    name: str | None = None,
) -> list[AttackResult]:
    """Runs the attack ``config`` on every problem at once (one shape bucket, one objective and style).

    Returns one result per problem, in order. Each result's ``seconds`` is its share of the group's wall
    time (the group's time divided by its size), so a report's sums stay the run's time; ``trace`` gains
    ``batch_examples``, the group's size. An error in any example is raised after all have stopped.
    """
    if not problems:
        return []
    method = registry.method_of(config)
    pool = ComputePool(loaded, problems)
    evaluators = [PooledEvaluator(loaded, p, pool, i) for i, p in enumerate(problems)]
    results: list[AttackResult | None] = [None] * len(problems)
    errors: list[BaseException | None] = [None] * len(problems)

    def work(i: int) -> None:
        try:
            results[i] = method.run(evaluators[i], config, np.random.default_rng(config.seed))
        except BaseException as error:  # re-raised in the caller's thread below
            errors[i] = error
        finally:
            pool.leave(i)

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,), name=f"attack-{i}") for i in range(len(problems))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    share = (time.perf_counter() - start) / len(problems)
    for error in errors:
        if error is not None:
            raise error
    return [
        dataclasses.replace(
            r, method=name or config.method, seconds=share, trace={**r.trace, "batch_examples": len(problems)}
        )
        for r in results
    ]
