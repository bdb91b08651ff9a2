"""atp-jax: Adversarial Table Permutation in JAX/Flax.

How fragile is LLM table question answering to the order of a table's rows and columns? ATP
searches for the worst order by gradient through Sinkhorn soft permutations.
"""

from atp_jax.models.loading import DEFAULT_MODEL, LoadedModel, load_model

__all__ = ["DEFAULT_MODEL", "LoadedModel", "load_model"]
__version__ = "0.1.0"
