"""Low-rank adapters (LoRA, Hu et al. 2021) as a pure transform of the stacked layer weights.

No maintained JAX LoRA library is among the project's dependencies, and the transform is a few lines over the
model's own layout, so it is written here: for each targeted kernel ``W [L, in, out]`` (``LayerStack`` stores
kernels as ``(in, out)``, one slice per layer) the adapter holds ``A [L, in, r]`` and ``B [L, r, out]``, and the
model runs on ``W + (alpha / r) · A @ B``. ``B`` starts at zero, so an untrained adapter computes exactly the base
model; ``A`` starts at ``N(0, 1/in)`` so that ``B``'s first gradients are of the scale of the layer's inputs.

The merged weights are formed in float32 and cast to the base weight's dtype (the decoder's ``lax.scan`` carries
activations in the parameter dtype, so a kernel may not change dtype). With bfloat16 weights a small update
``(alpha / r) · A @ B`` is rounded away where it is below bfloat16's resolution of ``W``; the adapter still gets
its gradient (the cast passes it through), but train in float32 where that matters.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

# The decoder's kernels (``atp_jax.models.schema``), each stored ``[L, in, out]``.
KERNELS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Which kernels get an adapter and how large (frozen and hashable: a jit static argument).

    rank: ``r``, the adapters' inner dimension (≥ 1).
    alpha: the update is scaled by ``alpha / rank``, so the learning rate that suits one rank suits another.
    targets: kernel names from ``KERNELS``.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = KERNELS

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoraConfig.rank={self.rank}; it must be >= 1 (rank 0 means a full fine-tune)")
        object.__setattr__(self, "targets", tuple(self.targets))  # a list would make the config unhashable
        unknown = [t for t in self.targets if t not in KERNELS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoraConfig.targets={self.targets}: give distinct kernel names from {', '.join(KERNELS)}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def init_lora(
    layer_weights: dict[str, jax.Array], config: LoraConfig, key: jax.Array
) -> dict[str, dict[str, jax.Array]]:
    """Fresh adapters for ``layer_weights`` (``LayerStack.weights()``: name -> ``[L, in, out]`` kernels, …).

    Returns ``{target: {"a": [L, in, r] ~ N(0, 1/in), "b": zeros [L, r, out]}}`` in float32 (the optimizer's
    precision whatever the model's dtype). Target ``i`` of ``config.targets`` draws from ``fold_in(key, i)``,
    so one target's adapter does not depend on which others are trained.
    """
    lora = {}
    for i, name in enumerate(config.targets):
        if name not in layer_weights:
            raise ValueError(f"LoRA target {name!r} is not a weight of this model ({', '.join(sorted(layer_weights))})")
        L, fan_in, fan_out = layer_weights[name].shape
        a = jax.random.normal(jax.random.fold_in(key, i), (L, fan_in, config.rank), jnp.float32)
        lora[name] = {"a": a / jnp.sqrt(jnp.float32(fan_in)), "b": jnp.zeros((L, config.rank, fan_out), jnp.float32)}
    return lora


def merge(
    layer_weights: dict[str, jax.Array], lora: dict[str, dict[str, jax.Array]], config: LoraConfig
) -> dict[str, jax.Array]:
    """``layer_weights`` with ``W + (alpha / r) · A @ B`` for every adapter in ``lora`` (pure, jittable).

    The product is formed in float32 and the sum cast to ``W``'s dtype; weights without an adapter pass
    through unchanged.
    """
    merged = dict(layer_weights)
    for name, adapter in lora.items():
        w = layer_weights[name]
        delta = jnp.einsum("lir,lro->lio", adapter["a"].astype(jnp.float32), adapter["b"].astype(jnp.float32))
        merged[name] = (w.astype(jnp.float32) + config.scale * delta).astype(w.dtype)
    return merged
