"""A Flax NNX decoder for the Llama family and Qwen2, driven by explicit embeddings, positions and masks.

The attack feeds the model *mixed* token embeddings, position ids of a permuted layout and its own
attention masks, so all three are plain arguments of ``Transformer.__call__`` and the token-embedding
lookup is a separate method. The layer weights are stacked along a leading ``[L]`` axis and run with
``lax.scan``: one layer is traced and compiled once, which keeps compile time flat in depth.

Numerics: parameters may be float32 or bfloat16; RMSNorm, RoPE, attention softmax and logits are
computed in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from atp_jax.models.config import ModelConfig, rope_inverse_frequencies
from atp_jax.models.schema import TensorSpec, schema_for


class KVCache(NamedTuple):
    """Keys and values of every layer, ``[L, B, T, H_kv, Dh]`` each, for T cache slots."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, config: ModelConfig, batch: int, length: int, dtype) -> KVCache:
        shape = (config.num_layers, batch, length, config.num_kv_heads, config.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


class DecoderOutput(NamedTuple):
    logits: jax.Array  # [B, P, V] float32 at the requested positions (P = S when none requested)
    hidden: jax.Array  # [B, S, D] final-norm hidden states
    cache: KVCache | None  # updated cache when one was passed in
    attentions: jax.Array | None  # [L, B, H, S, T] float32 attention probabilities when requested


def _schema_param(spec: TensorSpec, config: ModelConfig, dtype, rngs: nnx.Rngs) -> nnx.Param:
    """The parameter ``spec`` describes, randomly initialised: N(0, 0.02²), or ones for norm weights."""
    shape = spec.model_shape(config)
    if spec.init == "ones":
        return nnx.Param(jnp.ones(shape, dtype))
    return nnx.Param((0.02 * jax.random.normal(rngs.params(), shape)).astype(dtype))


class LayerStack(nnx.Module):
    """All decoder layers' weights stacked on a leading [L] axis, kernels stored as (in, out).

    The parameters and their shapes are the per-layer tensors of the architecture's schema
    (``atp_jax.models.schema``): ``attn_norm``, ``q_proj``/``k_proj``/``v_proj`` (+ ``*_bias``), ``o_proj``,
    ``mlp_norm``, ``gate_proj``, ``up_proj``, ``down_proj``.
    """

    def __init__(self, c: ModelConfig, dtype, rngs: nnx.Rngs):
        for spec in schema_for(c.architecture).tensors_for(c):
            if spec.per_layer:
                setattr(self, spec.attribute, _schema_param(spec, c, dtype, rngs))

    def weights(self) -> dict[str, jax.Array]:
        return {name: value for name, value in nnx.to_pure_dict(nnx.state(self)).items()}


def rms_norm(x, weight, eps):
    """RMSNorm in float32, cast back to ``x.dtype`` (as HF Llama/Qwen2 do)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def rope_tables(inv_freq, position_ids):
    """cos/sin ``[B, S, Dh]`` float32 for ``position_ids`` [B, S] (HF's rotate-half layout); ids are integers,
    or fractional where a relaxation spreads a token's position (RoPE is a smooth function of it)."""
    angles = position_ids.astype(jnp.float32)[..., None] * inv_freq  # [B, S, Dh/2]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """Rotates ``x`` [B, S, H, Dh] by the position angles; computed in float32."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


def expand_mask(attention_mask, num_queries: int):
    """A boolean ``[B, S, T]`` mask (True = may attend) from either accepted form.

    ``[B, S]`` is a padding mask over the S input tokens (no cache): causal order is added.
    ``[B, S, T]`` is a full mask used exactly as given (the caller owns causality, e.g. for cache slots
    or a permuted layout).
    """
    mask = attention_mask.astype(bool)
    if mask.ndim == 3:
        return mask
    if mask.ndim != 2:
        raise ValueError(f"attention_mask must be [B, S] or [B, S, T], got shape {attention_mask.shape}")
    causal = jnp.tril(jnp.ones((num_queries, mask.shape[1]), bool))
    return causal[None] & mask[:, None, :]


class Transformer(nnx.Module):
    """Decoder-only transformer (Llama / Qwen2) over explicit embeddings, positions and masks."""

    def __init__(
        self, config: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs, mesh: Mesh | None = None, remat: bool = False
    ):
        self.config = config
        self.dtype = dtype
        # Recompute each layer in the backward pass (jax.checkpoint on the scanned layer) instead of keeping its
        # activations: a gradient then holds one [B, S, D] per layer rather than every layer's [B, H, S, S]
        # attention scores, at the price of one more forward. Values and gradients are unchanged.
        self.remat = remat
        # The mesh the weights live on (atp_jax.sharding; None: one device). Callers place their batches on it.
        self.mesh = mesh
        # Global tensors of the schema: the embeddings, then (after the layers) the final norm and an
        # untied head. Drawing them in schema order keeps seeded random models as they were.
        specs = {s.field: s for s in schema_for(config.architecture).tensors_for(config) if not s.per_layer}
        self.embed_tokens = _schema_param(specs.pop("embed_tokens"), config, dtype, rngs)
        self.layers = LayerStack(config, dtype, rngs)
        for spec in specs.values():
            setattr(self, spec.attribute, _schema_param(spec, config, dtype, rngs))

    def embed(self, token_ids):
        """Token-embedding lookup: int ``[...]`` -> ``[..., D]`` in the parameter dtype."""
        return jnp.take(self.embed_tokens[...], token_ids, axis=0)

    def logits(self, hidden):
        """Vocabulary logits ``[..., V]`` float32 from final-norm hidden states ``[..., D]``."""
        if self.config.tie_word_embeddings:
            out = jnp.einsum("...d,vd->...v", hidden, self.embed_tokens[...], preferred_element_type=jnp.float32)
        else:
            out = jnp.einsum("...d,dv->...v", hidden, self.lm_head[...], preferred_element_type=jnp.float32)
        return out.astype(jnp.float32)

    def __call__(
        self,
        inputs_embeds,
        position_ids,
        attention_mask,
        *,
        cache: KVCache | None = None,
        cache_index=0,
        logits_positions=None,
        return_attentions: bool = False,
    ) -> DecoderOutput:
        """Runs the decoder.

        Args:
          inputs_embeds: ``[B, S, D]`` input embeddings (any float dtype; cast to the parameter dtype).
          position_ids: ``[B, S]`` RoPE positions (integer; float where a relaxation makes them fractional).
          attention_mask: ``[B, S]`` padding mask (causal order added) or full ``[B, S, T]`` mask, where
            T = S without a cache and T = the cache length with one.
          cache: optional ``KVCache`` with T slots; this call's keys/values are written at
            ``cache_index`` .. ``cache_index + S`` and attention runs over all T slots.
          logits_positions: optional int ``[B, P]`` indices into S: logits only there (the
            vocabulary projection is the most expensive single matmul of a small model).
          return_attentions: also return per-layer attention probabilities ``[L, B, H, S, T]``.
        """
        c = self.config
        if cache is not None and attention_mask.ndim != 3:
            raise ValueError("with a KV cache, pass the full [B, S, T] attention mask over the cache's T slots")
        x = inputs_embeds.astype(self.dtype)
        B, S, _ = x.shape
        mask = expand_mask(attention_mask, S)
        cos, sin = rope_tables(jnp.asarray(rope_inverse_frequencies(c)), position_ids)
        scale = 1.0 / np.sqrt(c.head_dim)
        weights = self.layers.weights()

        def layer(h, xs):
            w, cache_k, cache_v = xs
            y = rms_norm(h, w["attn_norm"], c.rms_norm_eps)
            q = y @ w["q_proj"]
            k = y @ w["k_proj"]
            v = y @ w["v_proj"]
            if c.attention_bias:
                q, k, v = q + w["q_bias"], k + w["k_bias"], v + w["v_bias"]
            q = apply_rope(q.reshape(B, S, c.num_heads, c.head_dim), cos, sin)
            k = apply_rope(k.reshape(B, S, c.num_kv_heads, c.head_dim), cos, sin)
            v = v.reshape(B, S, c.num_kv_heads, c.head_dim)
            if cache_k is not None:
                k = jax.lax.dynamic_update_slice_in_dim(cache_k, k.astype(cache_k.dtype), cache_index, axis=1)
                v = jax.lax.dynamic_update_slice_in_dim(cache_v, v.astype(cache_v.dtype), cache_index, axis=1)
            # Grouped-query attention without repeating K/V: queries as [B, S, H_kv, G, Dh].
            qg = q.reshape(B, S, c.num_kv_heads, c.num_groups, c.head_dim)
            scores = jnp.einsum("bskgd,btkd->bkgst", qg, k.astype(q.dtype), preferred_element_type=jnp.float32)
            scores = jnp.where(mask[:, None, None], scores * scale, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1)
            attn = jnp.einsum("bkgst,btkd->bskgd", probs.astype(self.dtype), v.astype(self.dtype))
            h = h + attn.reshape(B, S, c.num_heads * c.head_dim) @ w["o_proj"]
            y = rms_norm(h, w["mlp_norm"], c.rms_norm_eps)
            h = h + (jax.nn.silu(y @ w["gate_proj"]) * (y @ w["up_proj"])) @ w["down_proj"]
            probs_out = probs.reshape(B, c.num_heads, S, -1) if return_attentions else None
            return h, (k if cache_k is not None else None, v if cache_k is not None else None, probs_out)

        cache_xs = (cache.k, cache.v) if cache is not None else (None, None)
        body = jax.checkpoint(layer, prevent_cse=False) if self.remat else layer  # no CSE to undo inside a scan
        x, (new_k, new_v, attentions) = jax.lax.scan(body, x, (weights, *cache_xs))
        hidden = rms_norm(x, self.final_norm[...], c.rms_norm_eps)
        selected = hidden
        if logits_positions is not None:
            selected = jnp.take_along_axis(hidden, logits_positions[..., None].astype(jnp.int32), axis=1)
        return DecoderOutput(
            logits=self.logits(selected),
            hidden=hidden,
            cache=KVCache(new_k, new_v) if cache is not None else None,
            attentions=attentions,
        )


def default_positions(padding_mask):
    """Position ids ``[B, S]`` that count only real tokens (left padding gets position 0)."""
    return jnp.maximum(jnp.cumsum(padding_mask.astype(jnp.int32), axis=-1) - 1, 0)
