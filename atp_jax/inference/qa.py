"""Answering table questions and scoring the reference answer, always from re-rendered text.

Every number reported for a permutation comes from here: the permuted table is rendered as text,
the prompt tokenized afresh, and the model run on those tokens. (The attack's own layout tokenizes
cells one by one; that is a search device, not a measurement.)
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atp_jax.inference.generate import generate_ids, padded_length
from atp_jax.models.loading import LoadedModel
from atp_jax.models.modeling import Transformer
from atp_jax.tables.buckets import DEFAULT_BUCKETS, BucketGrid, power_of_two_batch
from atp_jax.tables.prompt import (
    PromptStyle,
    encode_text,
    extract_answer,
    reference_answer,
    render_prompt,
)
from atp_jax.tables.table import Example, Table


class InputTooLong(ValueError):
    """A prompt (plus the tokens to score or generate after it) longer than the model's context."""


def check_context(loaded: LoadedModel, example: Example, prompt_length: int, extra_tokens: int) -> None:
    """Raises ``InputTooLong`` when ``prompt_length + extra_tokens`` exceeds the model's context."""
    limit = loaded.config.max_position_embeddings
    if prompt_length + extra_tokens > limit:
        raise InputTooLong(
            f"example {example.id!r}: the prompt has {prompt_length} tokens and {extra_tokens} more are "
            f"needed after it, over the model's context of {limit}; filter long tables out "
            "(--max_rows/--max_cols)"
        )


def prompt_ids(loaded: LoadedModel, example: Example, table: Table | None = None, style=PromptStyle()) -> list[int]:
    """Token ids of the chat prompt (up to the assistant header) over ``table`` (default: the example's)."""
    return encode_text(loaded.tokenizer, render_prompt(loaded.tokenizer, example, table, style).text)


@jax.jit
def token_nll(model: Transformer, ids, target_positions, targets):
    """Negative log-likelihood of ``targets`` ``[B, A]`` predicted at ``target_positions`` ``[B, A]``.

    ``ids`` ``[B, S]`` are right-padded: causal attention makes the padding after the answer inert.
    Returns ``[B, A]`` float32.
    """
    B, S = ids.shape
    out = model(
        model.embed(ids),
        jnp.broadcast_to(jnp.arange(S), (B, S)),
        jnp.ones((B, S), bool),
        logits_positions=target_positions,
    )
    logp = jax.nn.log_softmax(out.logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def answer_losses(
    loaded: LoadedModel,
    example: Example,
    tables: Sequence[Table],
    style: PromptStyle = PromptStyle(),
    batch_size: int = 8,
    buckets: BucketGrid | None = DEFAULT_BUCKETS,
) -> np.ndarray:
    """Mean token cross-entropy of the reference answer under each table ``[K]`` (batched forwards).

    With ``buckets`` the sequences are right-padded to the grid's text length, the answer slots to its
    answer length (extra slots repeat the last answer token and are left out of the mean) and the batch to
    a power of two up to ``batch_size``, so examples of one bucket share one program; without, to a multiple
    of 32 tokens and exactly the answer's length. Right padding is inert under causal attention, so both
    give the same losses.
    """
    tok = loaded.tokenizer
    target = encode_text(tok, reference_answer(example))
    prompts = [prompt_ids(loaded, example, t, style) for t in tables]
    A = len(target)
    check_context(loaded, example, max(len(p) for p in prompts), A)
    slots = A if buckets is None or buckets.answer is None else buckets.answer.fit(A)
    scored = np.asarray(target + target[-1:] * (slots - A), np.int32)
    losses = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        longest = max(len(p) for p in chunk) + A
        if buckets is None:
            S = padded_length(longest)  # right padding to a multiple of 32: fewer distinct compiles
            rows = batch_size if len(prompts) > batch_size else len(chunk)
        else:
            S = buckets.text_length(longest)
            rows = power_of_two_batch(len(chunk), batch_size)
        ids = np.zeros((rows, S), np.int32)
        positions = np.zeros((rows, slots), np.int32)
        for b, p in enumerate(chunk):
            ids[b, : len(p) + A] = p + target
            positions[b] = np.minimum(np.arange(len(p) - 1, len(p) - 1 + slots), len(p) - 2 + A)
        nll = token_nll(loaded.model, ids, positions, np.broadcast_to(scored, (rows, slots)))
        losses.extend(np.asarray(nll)[: len(chunk), :A].mean(axis=1).tolist())
    return np.asarray(losses)


def answer_loss(loaded: LoadedModel, example: Example, table: Table | None = None, style=PromptStyle()) -> float:
    """Mean token cross-entropy of the reference answer given the (re-rendered, re-tokenized) prompt."""
    return float(answer_losses(loaded, example, [example.table if table is None else table], style)[0])


def answers(
    loaded: LoadedModel,
    example: Example,
    tables: Sequence[Table],
    style: PromptStyle = PromptStyle(),
    max_new_tokens: int | None = None,
) -> list[str]:
    """The model's answers (extracted from greedy replies) for the example under each table."""
    return answers_many(loaded, [(example, t) for t in tables], style, max_new_tokens)


def answers_many(
    loaded: LoadedModel,
    questions: Sequence[tuple[Example, Table]],
    style: PromptStyle = PromptStyle(),
    max_new_tokens: int | None = None,
) -> list[str]:
    """The model's answers to several (example, table) pairs, possibly of different examples, in one batched
    generation."""
    if max_new_tokens is None:
        max_new_tokens = 32 if style.reasoning == "concise" else 256
    prompts = [prompt_ids(loaded, example, table, style) for example, table in questions]
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))  # the longest prompt decides
    check_context(loaded, questions[longest][0], len(prompts[longest]), max_new_tokens)
    replies = generate_ids(loaded, prompts, max_new_tokens)
    return [extract_answer(loaded.tokenizer.decode(r, skip_special_tokens=True), style) for r in replies]


def answer(
    loaded: LoadedModel,
    example: Example,
    table: Table | None = None,
    style: PromptStyle = PromptStyle(),
    max_new_tokens: int | None = None,
) -> str:
    """The model's answer to ``example`` over ``table`` (default: the example's own table)."""
    return answers(loaded, example, [example.table if table is None else table], style, max_new_tokens)[0]
