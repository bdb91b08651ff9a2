"""atp-jax: Adversarial Table Permutation in JAX/Flax.

How fragile is LLM table question answering to the order of a table's rows and columns? ATP
searches for the worst order by gradient through Sinkhorn soft permutations.
"""

from atp_jax.attack.atp import ATPConfig
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.presets import preset
from atp_jax.attack.result import AttackResult
from atp_jax.attack.run import attack
from atp_jax.data import registry as _dataset_registry  # registers the datasets' answer wording with the prompt
from atp_jax.inference.qa import answer, answer_loss
from atp_jax.models.loading import DEFAULT_MODEL, LoadedModel, load_model
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example, Table
from atp_jax.version import __version__

del _dataset_registry

__all__ = [
    "__version__",
    "ATPConfig",
    "AttackConfig",
    "AttackResult",
    "DEFAULT_MODEL",
    "Example",
    "LoadedModel",
    "PromptStyle",
    "Table",
    "answer",
    "answer_loss",
    "attack",
    "load_model",
    "preset",
]
