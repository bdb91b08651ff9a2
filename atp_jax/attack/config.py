"""What every attack's configuration shares: ``AttackConfig``, the base of each method's own config.

A method's config is a frozen dataclass deriving from ``AttackConfig`` with its own fields and a
``method`` class attribute naming it; the registry (``atp_jax.attack.registry``) pairs it with the
method's ``run``. Choices are validated once, here, from the ``choices`` each class declares.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

MODES = ("row", "col", "joint")
OBJECTIVES = ("ce", "kl")
DIRECTIONS = ("gradient", "reversed", "random")


@dataclasses.dataclass(frozen=True)
class AttackConfig:
    """Fields every method has.

    mode: permute ``row``s, ``col``umns or both (``joint``).
    objective: ``ce`` (reference answer's cross-entropy) or ``kl`` (label-free, paper A.7).
    seed: PRNG seed (the JAX key and the numpy generator derive from it).
    """

    method: ClassVar[str] = ""
    # field -> allowed values, merged along the class hierarchy
    choices: ClassVar[dict[str, tuple]] = {"mode": MODES, "objective": OBJECTIVES}
    # fields that must be >= 1
    positive: ClassVar[tuple[str, ...]] = ()

    mode: str = "joint"
    objective: str = "ce"
    seed: int = 0

    def __post_init__(self):
        for cls in type(self).__mro__:
            for name, allowed in vars(cls).get("choices", {}).items():
                if getattr(self, name) not in allowed:
                    raise ValueError(
                        f"{type(self).__name__}.{name}={getattr(self, name)!r}; "
                        f"choose one of {', '.join(map(str, allowed))}"
                    )
            for name in vars(cls).get("positive", ()):
                if getattr(self, name) < 1:
                    raise ValueError(f"{type(self).__name__}.{name}={getattr(self, name)!r}; it must be >= 1")

    def as_dict(self) -> dict:
        """The method and every field: what a run manifest records."""
        return {"method": self.method, **dataclasses.asdict(self)}
