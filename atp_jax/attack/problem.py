"""One example made ready for attack: embeddings, layout, prefix cache and the objective.

Everything a permutation cannot change is computed once here: the token embeddings of every cell
and template run, and the keys/values of the prompt prefix (system prompt, instruction, "Table:").
An attack step then runs the decoder only over the body (table + question + answer) and computes
logits only at the answer positions.

Conventions (shared with ``layout.place`` and ``hungarian.project``): a soft row matrix ``D_r`` is
``[n+1, n+1]`` *slot-major* (``D_r[a, i]`` = weight of source row i in slot row a, header pinned),
a column matrix ``D_c`` is ``[m, m]`` slot-major too (``D_c[b, j]``). The paper's right-multiplied
column matrix is its transpose. Hard permutations are index vectors ``row_perm [n]`` (data rows)
and ``col_perm [m]``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from atp_jax.inference.qa import answers as generate_answers
from atp_jax.models.loading import LoadedModel
from atp_jax.models.modeling import KVCache, Transformer
from atp_jax.tables.layout import Layout, build_layout, full_row_perm, place
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example

OBJECTIVES = ("ce", "kl")


class AttackInputError(ValueError):
    """An example the attack cannot run on (too small, too long, no answer); the message says why."""


@struct.dataclass
class ProblemTensors:
    """The device arrays of one example (a pytree: pass it through ``jit``; sizes are static)."""

    layout: ProblemTensors  # Layout.arrays(): integer arrays for ``place``
    cell_embeds: jax.Array  # [n+1, m, L, D], zeros at padding
    template_embeds: jax.Array  # [Tt, D]
    prefix_k: jax.Array  # [Lyr, 1, P + S_body, H_kv, Dh], prefix slots filled
    prefix_v: jax.Array
    targets: jax.Array  # [A] answer ids
    answer_positions: jax.Array  # [A] body indices whose logits predict the targets
    clean_logprobs: jax.Array | None  # [A, V] for the KL objective
    prefix_length: int = struct.field(pytree_node=False)
    body_length: int = struct.field(pytree_node=False)


@dataclasses.dataclass(frozen=True)
class AttackProblem:
    """One example ready for attack: its layout (host) and its tensors (device)."""

    example: Example
    layout: Layout
    style: PromptStyle
    objective: str
    tensors: ProblemTensors

    @property
    def n_rows(self) -> int:
        return self.layout.n_rows

    @property
    def n_cols(self) -> int:
        return self.layout.n_cols

    def attention_bytes(self, config, batch: int, through_layers: bool) -> int:
        """Bytes of float32 attention weights ``[batch, heads, S_body, P + S_body]`` — per layer, or for every
        layer at once when a backward keeps them (``through_layers``): the part of an attack's memory that
        grows with the square of the prompt."""
        S, T = self.layout.body_length, self.layout.prefix_length + self.layout.body_length
        layers = config.num_layers if through_layers else 1
        return 4 * layers * batch * config.num_heads * S * T


def make_problem(
    loaded: LoadedModel,
    example: Example,
    style: PromptStyle = PromptStyle(),
    objective: str = "ce",
    max_seq_length: int | None = None,
) -> AttackProblem:
    """Prepares ``example`` for attack; raises ``AttackInputError`` for examples that cannot be attacked."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    table = example.table
    if table.n_rows == 0 or table.n_cols == 0:
        raise AttackInputError(f"example {example.id!r}: the table has no data rows or no columns; nothing to reorder")
    if table.n_rows < 2 and table.n_cols < 2:
        raise AttackInputError(f"example {example.id!r}: a {table.n_rows}x{table.n_cols} table has no order to attack")
    if objective == "kl":
        # Label-free (paper A.7): the target is the model's own clean greedy answer.
        (clean,) = generate_answers(loaded, example, [table], style)
        if not clean.strip():
            raise AttackInputError(
                f"example {example.id!r}: the model's clean answer is empty; nothing to diverge from"
            )
        example_for_layout = dataclasses.replace(example, answers=(clean,))
    else:
        if not example.answers or not any(a.strip() for a in example.answers):
            raise AttackInputError(f"example {example.id!r} has no reference answer; use objective='kl'")
        example_for_layout = example
    layout = build_layout(loaded.tokenizer, example_for_layout, style=style)
    limit = max_seq_length or loaded.config.max_position_embeddings
    if layout.seq_length > limit:
        raise AttackInputError(
            f"example {example.id!r}: the prompt has {layout.seq_length} tokens, over the limit of {limit}; "
            "filter long tables out (max rows/columns/prompt tokens)"
        )
    model = loaded.model
    lengths = layout.cell_lengths[..., None] > np.arange(layout.max_cell_tokens)
    cell_embeds = model.embed(jnp.asarray(layout.cell_ids)) * jnp.asarray(lengths[..., None], model.dtype)
    prefix_k, prefix_v = _prefix_cache(model, jnp.asarray(layout.prefix_ids), layout.seq_length)
    tensors = ProblemTensors(
        layout=layout.arrays(),
        cell_embeds=cell_embeds,
        template_embeds=model.embed(jnp.asarray(layout.template_ids)),
        prefix_k=prefix_k,
        prefix_v=prefix_v,
        targets=jnp.asarray(layout.answer_ids),
        answer_positions=jnp.asarray(layout.answer_logit_positions()),
        clean_logprobs=None,
        prefix_length=layout.prefix_length,
        body_length=layout.body_length,
    )
    if objective == "kl":
        body = hard_body(tensors, jnp.arange(layout.n_rows), jnp.arange(layout.n_cols))
        clean = jax.nn.log_softmax(answer_logits(model, tensors, body[None])[0], axis=-1)
        tensors = tensors.replace(clean_logprobs=clean)
    return AttackProblem(example, layout, style, objective, tensors)


@functools.partial(jax.jit, static_argnames=("total_length",))
def _prefix_cache(model: Transformer, prefix_ids, total_length: int):
    P = prefix_ids.shape[0]
    cache = KVCache.zeros(model.config, 1, total_length, model.dtype)
    causal = jnp.arange(total_length)[None, :] <= jnp.arange(P)[:, None]  # [P, T]
    out = model(
        model.embed(prefix_ids[None]),
        jnp.arange(P)[None],
        causal[None],
        cache=cache,
        logits_positions=jnp.zeros((1, 1), jnp.int32),
    )
    return out.cache.k, out.cache.v


def soft_body(t: ProblemTensors, D_r, D_c, row_perm, col_perm):
    """Body embeddings ``[S_body, D]`` with cells mixed by soft ``D_r [n+1, n+1]`` and ``D_c [m, m]`` and laid
    out by the hard permutations (paper Eq. 11). Mixing in float32, cast to the model dtype last."""
    cells = t.cell_embeds
    mixed = jnp.einsum("ai,ijkd,bj->abkd", D_r, cells.astype(jnp.float32), D_c).astype(cells.dtype)
    return _gather(t, mixed, row_perm, col_perm)


def hard_body(t: ProblemTensors, row_perm, col_perm):
    """Body embeddings ``[S_body, D]`` of a hard permutation (exactly the permuted prompt's embeddings)."""
    slots = t.cell_embeds[full_row_perm(row_perm)][:, col_perm]
    return _gather(t, slots, row_perm, col_perm)


def _gather(t: ProblemTensors, slot_embeds, row_perm, col_perm):
    n1, m, L, D = slot_embeds.shape
    source = place(t.layout, row_perm, col_perm, body_length=t.body_length, max_cell_tokens=L)
    bank = jnp.concatenate([t.template_embeds, slot_embeds.reshape(n1 * m * L, D)], axis=0)
    return bank[source]


def answer_logits(model: Transformer, t: ProblemTensors, bodies):
    """Logits ``[B, A, V]`` at the answer positions for body embeddings ``[B, S_body, D]``.

    The decoder runs over the body only, attending to the prefix through its precomputed cache.
    """
    B = bodies.shape[0]
    P, S = t.prefix_length, t.body_length
    cache = KVCache(*(jnp.broadcast_to(c, (c.shape[0], B, *c.shape[2:])) for c in (t.prefix_k, t.prefix_v)))
    slots = jnp.arange(P + S)
    mask = (slots[None, :] < P) | (slots[None, :] - P <= jnp.arange(S)[:, None])  # [S, P + S]
    out = model(
        bodies,
        jnp.broadcast_to(P + jnp.arange(S), (B, S)),
        jnp.broadcast_to(mask, (B, S, P + S)),
        cache=cache,
        cache_index=P,
        logits_positions=jnp.broadcast_to(t.answer_positions, (B, t.answer_positions.shape[0])),
    )
    return out.logits


def objective_value(t: ProblemTensors, logits, objective: str):
    """Per-sequence loss ``[B]`` to maximise: mean answer-token CE, or summed KL(clean || permuted)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    if objective == "ce":
        return -jnp.take_along_axis(logp, t.targets[None, :, None], axis=-1)[..., 0].mean(axis=-1)
    clean = t.clean_logprobs
    return jnp.sum(jnp.exp(clean) * (clean - logp), axis=(-1, -2))


@functools.partial(jax.jit, static_argnames=("objective",))
def hard_losses(model: Transformer, t: ProblemTensors, row_perms, col_perms, objective: str = "ce"):
    """Objective ``[B]`` of hard permutations ``row_perms [B, n]``, ``col_perms [B, m]`` in one batched forward."""
    bodies = jax.vmap(lambda r, c: hard_body(t, r, c))(row_perms, col_perms)
    return objective_value(t, answer_logits(model, t, bodies), objective)
