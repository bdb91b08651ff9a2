"""Greedy decoding with a KV cache under ``jax.jit``, batched with left padding."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from atp_jax.models.modeling import KVCache, Transformer, default_positions
from atp_jax.tables.buckets import DEFAULT_BUCKETS

# Without shape buckets, re-rendered sequences are padded up to a multiple of this.
LENGTH_BUCKET = 32


def padded_length(length: int) -> int:
    """``length`` rounded up to the next multiple of ``LENGTH_BUCKET``."""
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


if TYPE_CHECKING:
    from atp_jax.models.loading import LoadedModel


@functools.partial(jax.jit, static_argnames=("max_new_tokens",))
def greedy_decode(model: Transformer, token_ids, padding_mask, stop_ids, pad_id, max_new_tokens: int):
    """Greedy continuation of left-padded prompts.

    Args:
      token_ids: ``[B, S0]`` int prompt ids, left-padded.
      padding_mask: ``[B, S0]`` bool, False at the padding.
      stop_ids: ``[K]`` int ids that end a sequence (the stop token itself is emitted).
      pad_id: id written after a sequence has stopped.
      max_new_tokens: static number of decode steps at most.

    Returns:
      ``[B, max_new_tokens]`` int32 generated ids (``pad_id`` after a stop).
    """
    B, S0 = token_ids.shape
    T = S0 + max_new_tokens
    slots = jnp.arange(T)
    slot_valid = jnp.concatenate([padding_mask, jnp.ones((B, max_new_tokens), bool)], axis=1)  # [B, T]
    cache = KVCache.zeros(model.config, B, T, model.dtype)
    positions = default_positions(padding_mask)
    prefill_mask = slot_valid[:, None, :] & (slots[None, None, :] <= jnp.arange(S0)[None, :, None])
    out = model(
        model.embed(token_ids),
        positions,
        prefill_mask,
        cache=cache,
        cache_index=0,
        logits_positions=jnp.full((B, 1), S0 - 1),
    )
    first = jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32)

    def cond(state):
        t, _, done, *_ = state
        return (t < max_new_tokens) & ~jnp.all(done)

    def step(state):
        t, tokens, done, cache, next_token, last_position = state
        token = jnp.where(done, pad_id, next_token)
        tokens = tokens.at[:, t].set(token)
        done = done | jnp.isin(next_token, stop_ids)
        position = last_position + 1
        mask = (slot_valid & (slots[None, :] <= S0 + t))[:, None, :]  # [B, 1, T]
        out = model(model.embed(token[:, None]), position[:, None], mask, cache=cache, cache_index=S0 + t)
        next_token = jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32)
        return t + 1, tokens, done, out.cache, next_token, position

    tokens = jnp.full((B, max_new_tokens), pad_id, jnp.int32)
    state = (0, tokens, jnp.zeros((B,), bool), out.cache, first, positions[:, -1])
    return jax.lax.while_loop(cond, step, state)[1]


def generate_ids(loaded: LoadedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64) -> list[list[int]]:
    """Greedy continuations of token-id prompts, each cut after its first stop token (excluded)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate_ids needs at least one prompt and no empty prompt")
    longest = max(len(p) for p in prompts)
    S0 = DEFAULT_BUCKETS.text_length(longest)  # left padding (masked) to a shape bucket: one program per bucket
    ids = np.zeros((len(prompts), S0), np.int32)
    mask = np.zeros((len(prompts), S0), bool)
    for b, prompt in enumerate(prompts):
        ids[b, S0 - len(prompt) :] = prompt
        mask[b, S0 - len(prompt) :] = True
    stop_ids = loaded.stop_token_ids
    pad_id = stop_ids[0] if stop_ids else 0
    out = np.asarray(greedy_decode(loaded.model, ids, mask, np.asarray(stop_ids, np.int32), pad_id, max_new_tokens))
    results = []
    for row in out.tolist():
        cut = next((i for i, tok in enumerate(row) if tok in stop_ids), len(row))
        results.append(row[:cut])
    return results


def chat_prompt_ids(tokenizer, user: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat prompt ending with the assistant header (the template's own BOS rules)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def generate_chat(
    loaded: LoadedModel, users: Sequence[str], system: str | None = None, max_new_tokens: int = 64
) -> list[str]:
    """Greedy replies to one-turn chat messages, decoded to text."""
    prompts = [chat_prompt_ids(loaded.tokenizer, u, system) for u in users]
    return [
        loaded.tokenizer.decode(ids, skip_special_tokens=True).strip()
        for ids in generate_ids(loaded, prompts, max_new_tokens)
    ]
