"""The attack methods by name: each is its config type and one ``run(evaluator, config, rng)``.

Adding a method is one module (a config deriving from ``AttackConfig`` with a ``method`` name, and its
``run``) plus one ``register`` line below. ``register`` is public, so a method can also be added from
outside the package (a test, a user's module) before a run starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from atp_jax.attack import atp, baselines, frank_wolfe, search, structured
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.result import AttackResult, Evaluator

RunFn = Callable[[Evaluator, AttackConfig, np.random.Generator], AttackResult]


@dataclasses.dataclass(frozen=True)
class Method:
    """A registered attack method.

    config: its config type (``config.method`` is the method's name).
    run: ``run(evaluator, config, rng) -> AttackResult``.
    uses_gradient: True for methods that backpropagate; their controls (``direction=reversed|random``)
      are compared against them in reports.
    searches: True for methods that spend a query budget looking for a strong order (reports compare them
      with best-of-k); implied by ``uses_gradient``.
    """

    config: type[AttackConfig]
    run: RunFn
    uses_gradient: bool = False
    searches: bool = False

    @property
    def name(self) -> str:
        return self.config.method


_METHODS: dict[str, Method] = {}


def register(config: type[AttackConfig], run: RunFn, *, uses_gradient: bool = False, searches: bool = False) -> Method:
    """Registers a method under ``config.method``; registering another method under a taken name raises."""
    if not (isinstance(config, type) and issubclass(config, AttackConfig)) or not config.method:
        raise TypeError(f"{config!r} is not an AttackConfig subclass with a `method` name")
    entry = Method(config, run, uses_gradient, searches or uses_gradient)
    existing = _METHODS.get(config.method)
    if existing is not None and existing != entry:
        raise ValueError(f"an attack method named {config.method!r} is already registered ({existing.config.__name__})")
    _METHODS[config.method] = entry
    return entry


def method(name: str) -> Method:
    """The registered method ``name``; ``ValueError`` listing the known ones."""
    if name not in _METHODS:
        raise ValueError(f"unknown attack method {name!r}; registered: {', '.join(_METHODS)}")
    return _METHODS[name]


def method_of(config: AttackConfig) -> Method:
    """The method a config belongs to."""
    entry = method(config.method)
    if not isinstance(config, entry.config):
        raise TypeError(f"{type(config).__name__} is not the config of method {config.method!r}")
    return entry


def methods() -> tuple[str, ...]:
    """Registered method names, in registration order."""
    return tuple(_METHODS)


register(baselines.VanillaConfig, baselines.run_vanilla)
register(baselines.RandomConfig, baselines.run_random)
register(baselines.BestOfKConfig, baselines.run_best_of_k)
register(baselines.RowReverseConfig, baselines.run_row_reverse)
register(baselines.ColReverseConfig, baselines.run_col_reverse)
register(baselines.EvolutionConfig, baselines.run_evolution, searches=True)
register(atp.ATPConfig, atp.atp_attack, uses_gradient=True)
register(search.SearchConfig, search.search_attack, uses_gradient=True)
register(structured.StructuredConfig, structured.run_structured, searches=True)
register(structured.StructuredEvolutionConfig, structured.run_structured_evolution, searches=True)
register(frank_wolfe.FrankWolfeConfig, frank_wolfe.frank_wolfe_attack, uses_gradient=True)
