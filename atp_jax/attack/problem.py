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

Shape buckets (``buckets``, an ``atp_jax.tables.buckets.BucketGrid``): every array is padded to its
bucket's sizes and the real sizes (rows, columns, prefix length) travel as array *values*, so one compiled
program serves every example of a bucket. Padding is invisible: pad rows and columns are empty cells that
every order keeps in place (``row_perm[a] = a`` for a ≥ n; ``Layout.pad_perms``), pad body positions sit
after the answer (causal attention: nothing real sees them), pad prefix slots sit between the real prefix
and the body in the KV cache and are masked out of attention (position ids stay ``P + t``), and pad answer
tokens are left out of the loss. ``buckets=None`` keeps every size exact.
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
from atp_jax.tables.buckets import DEFAULT_BUCKETS, BucketGrid, Sizes
from atp_jax.tables.layout import (
    Layout,
    anchored_positions,
    build_layout,
    fixed_slot_positions,
    full_row_perm,
    pad_perms,
    place,
    run_positions,
    slot_run_lengths,
)
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example

OBJECTIVES = ("ce", "kl")


class AttackInputError(ValueError):
    """An example the attack cannot run on (too small, too long, no answer); the message says why."""


@struct.dataclass
class ProblemTensors:
    """The device arrays of one example, padded to its bucket (a pytree: pass it through ``jit``).

    Shapes use the bucket's sizes: ``N1`` slot rows (header included), ``M`` columns, ``L`` tokens per cell,
    ``Tt`` template tokens, ``P`` prefix slots, ``A`` answer slots; the real sizes are values.
    """

    layout: dict  # Layout.arrays(sizes=...): integer arrays for ``place``
    cell_embeds: jax.Array  # [N1, M, L, D], zeros at padding
    template_embeds: jax.Array  # [Tt, D]
    prefix_k: jax.Array  # [Lyr, 1, P, H_kv, Dh] keys of the prefix (slots past prefix_length: padding)
    prefix_v: jax.Array
    targets: jax.Array  # [A] answer ids
    answer_positions: jax.Array  # [A] body indices whose logits predict the targets
    answer_mask: jax.Array  # [A] float32, 1 at the real answer tokens
    n_rows: jax.Array  # int32 real data rows n (pad rows are n .. N1-2)
    n_cols: jax.Array  # int32 real columns m
    prefix_length: jax.Array  # int32 real prefix tokens
    clean_logprobs: jax.Array | None  # [A, V] for the KL objective
    body_length: int = struct.field(pytree_node=False)  # the body's padded length S (static)


@dataclasses.dataclass(frozen=True)
class AttackProblem:
    """One example ready for attack: its layout (host), its tensors (device) and the bucket they fill."""

    example: Example
    layout: Layout
    style: PromptStyle
    objective: str
    tensors: ProblemTensors
    buckets: BucketGrid | None = None
    sizes: Sizes | None = None  # the padded sizes (the layout's own without buckets)
    # Re-rendered text losses already measured, by (row order, column order): every attack on this problem
    # reports the original order's loss beside its own, which is then measured once per example, not per attack.
    measured: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def n_rows(self) -> int:
        return self.layout.n_rows

    @property
    def n_cols(self) -> int:
        return self.layout.n_cols

    @property
    def candidate_batches(self) -> tuple[int, ...]:
        """The batch sizes candidate orders are padded to: the grid's (one order, or its candidate batch), or
        without buckets powers of two up to 8 (less padding, more programs)."""
        if self.buckets is not None:
            return self.buckets.candidate_batches
        return _EXACT_CANDIDATE_BATCHES

    def padded_orders(self, row_perms, col_perms) -> tuple[np.ndarray, np.ndarray]:
        """Real orders ``[..., n]``, ``[..., m]`` as the tensors take them: ``[..., N1-1]``, ``[..., M]``, the pads
        fixed in place."""
        sizes = self.sizes or self.layout.sizes
        return pad_perms(row_perms, sizes.rows - 1), pad_perms(col_perms, sizes.cols)

    def attention_bytes(self, config, batch: int, through_layers: bool) -> int:
        """Bytes of float32 attention weights ``[batch, heads, S_body, P + S_body]`` — per layer, or for every
        layer at once when a backward keeps them (``through_layers``): the part of an attack's memory that
        grows with the square of the prompt."""
        sizes = self.sizes or self.layout.sizes
        S, T = sizes.body, sizes.prefix + sizes.body
        layers = config.num_layers if through_layers else 1
        return 4 * layers * batch * config.num_heads * S * T


_EXACT_CANDIDATE_BATCHES = (1, 2, 4, 8)  # without buckets: candidate batches padded up to one of these


def make_problem(
    loaded: LoadedModel,
    example: Example,
    style: PromptStyle = PromptStyle(),
    objective: str = "ce",
    max_seq_length: int | None = None,
    buckets: BucketGrid | None = DEFAULT_BUCKETS,
) -> AttackProblem:
    """Prepares ``example`` for attack; raises ``AttackInputError`` for examples that cannot be attacked.

    ``buckets`` pads every array to its shape bucket (one compile per bucket, not per example); ``None``
    keeps the example's exact sizes. Either gives the same orders and losses.
    """
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
    sizes = layout.sizes if buckets is None else buckets.fit(layout.sizes)
    tokens = layout.token_arrays(sizes)
    model = loaded.model
    cell_embeds, template_embeds = _embed_cells(model, tokens["cell_ids"], tokens["cell_mask"], tokens["template_ids"])
    prefix_k, prefix_v = _prefix_cache(model, tokens["prefix_ids"])
    # Host values reach the device by transfer: jnp.asarray / jnp.int32 would compile a program per shape and dtype.
    answer = jax.device_put(
        {
            "targets": np.asarray(tokens["answer_ids"], np.int32),
            "answer_positions": np.asarray(tokens["answer_positions"], np.int32),
            "answer_mask": np.asarray(tokens["answer_mask"], np.float32),
            "n_rows": np.int32(layout.n_rows),
            "n_cols": np.int32(layout.n_cols),
            "prefix_length": np.int32(layout.prefix_length),
        }
    )
    tensors = ProblemTensors(
        layout=layout.arrays(sizes=sizes),
        cell_embeds=cell_embeds,
        template_embeds=template_embeds,
        prefix_k=prefix_k,
        prefix_v=prefix_v,
        clean_logprobs=None,
        body_length=sizes.body,
        **answer,
    )
    if objective == "kl":
        tensors = tensors.replace(clean_logprobs=_clean_logprobs(model, tensors))
    return AttackProblem(example, layout, style, objective, tensors, buckets, sizes)


# Two programs rather than one: the prefix's forward depends on the prefix's bucket alone, which a sweep's
# questions mostly share, so it compiles once per sweep; only the cheap embedding lookups compile per bucket.
@jax.jit
def _embed_cells(model: Transformer, cell_ids, cell_mask, template_ids):
    """Cell embeddings ``[N1, M, L, D]`` (zeros at padding) and template embeddings ``[Tt, D]``."""
    cell_embeds = model.embed(cell_ids) * cell_mask[..., None].astype(model.dtype)
    return cell_embeds, model.embed(template_ids)


@jax.jit
def _prefix_cache(model: Transformer, prefix_ids):
    """The prefix's keys/values ``[Lyr, 1, P, H_kv, Dh]`` for prefix ids ``[P]`` (padded to its bucket)."""
    P = prefix_ids.shape[0]
    cache = KVCache.zeros(model.config, 1, P, model.dtype)
    # Causal: real prefix tokens never attend to the pad tokens after them.
    causal = jnp.arange(P)[None, :] <= jnp.arange(P)[:, None]
    out = model(
        model.embed(prefix_ids[None]),
        jnp.arange(P)[None],
        causal[None],
        cache=cache,
        logits_positions=jnp.zeros((1, 1), jnp.int32),
    )
    return out.cache.k, out.cache.v


@jax.jit
def _clean_logprobs(model: Transformer, t: ProblemTensors):
    """Log-probabilities ``[A, V]`` at the answer positions under the original order (the KL's reference)."""
    n, m = t.cell_embeds.shape[0] - 1, t.cell_embeds.shape[1]
    body = hard_body(t, jnp.arange(n), jnp.arange(m))
    return jax.nn.log_softmax(answer_logits(model, t, body[None])[0], axis=-1)


def soft_body(t: ProblemTensors, D_r, D_c, row_perm, col_perm):
    """Body embeddings ``[S_body, D]`` with cells mixed by soft ``D_r [N1, N1]`` and ``D_c [M, M]`` (identity on
    the pads) and laid out by the hard permutations (paper Eq. 11). Mixing in float32, cast to the model dtype
    last."""
    cells = t.cell_embeds
    mixed = jnp.einsum("ai,ijkd,bj->abkd", D_r, cells.astype(jnp.float32), D_c).astype(cells.dtype)
    return _gather(t, mixed, row_perm, col_perm)


def soft_positions(t: ProblemTensors, D_r, D_c, row_perm, col_perm):
    """Body position ids ``[S_body]`` (float32, from 0) of the hard order's tokens when every cell slot is as
    long as its *expected* length under soft ``D_r [N1, N1]`` (header pinned) and ``D_c [M, M]``: a run starts
    at the expected length of everything before it. At a hard vertex these are ``0, 1, 2, ...``; off it, the
    positions a reorder would shift move smoothly with D, so the gradient sees them (RoPE takes fractional
    positions)."""
    lengths = t.layout["cell_lengths"].astype(jnp.float32)
    expected = jnp.einsum("ai,ij,bj->ab", D_r, lengths, D_c)
    runs = slot_run_lengths(t.layout, expected)
    return run_positions(t.layout, row_perm, col_perm, runs.astype(jnp.float32), body_length=t.body_length)


def relaxed_positions(t: ProblemTensors, D_r, D_c, row_perm, col_perm, soft: bool):
    """Body position ids ``[S_body]`` (float32) of a relaxation: the hard order's ``0, 1, 2, ...``, or with
    ``soft`` (a Python bool: each choice is its own program) ``soft_positions``. Static rather than a traced
    switch because the soft branch and its gradient are a large share of an attack program's compile, which
    every hard-position run would otherwise pay."""
    if soft:
        return soft_positions(t, D_r, D_c, row_perm, col_perm)
    return jnp.arange(t.body_length, dtype=jnp.float32)


def hard_body(t: ProblemTensors, row_perm, col_perm):
    """Body embeddings ``[S_body, D]`` of a hard permutation (exactly the permuted prompt's embeddings)."""
    slots = t.cell_embeds[full_row_perm(row_perm)][:, col_perm]
    return _gather(t, slots, row_perm, col_perm)


def _gather(t: ProblemTensors, slot_embeds, row_perm, col_perm):
    n1, m, L, D = slot_embeds.shape
    source = place(t.layout, row_perm, col_perm, body_length=t.body_length, max_cell_tokens=L)
    bank = jnp.concatenate([t.template_embeds, slot_embeds.reshape(n1 * m * L, D)], axis=0)
    return bank[source]


def answer_logits(model: Transformer, t: ProblemTensors, bodies, body_positions=None):
    """Logits ``[B, A, V]`` at the answer positions for body embeddings ``[B, S_body, D]``.

    The decoder runs over the body only, attending to the prefix through its precomputed keys/values: the
    cache holds the prefix slots then the body's; pad prefix slots (past ``t.prefix_length``) are masked
    out, and body position t has position id ``prefix_length + t`` — or ``prefix_length + body_positions[b, t]``
    when ``body_positions [B, S_body]`` is given (the causal mask still follows the sequence order).
    """
    B, S = bodies.shape[:2]
    body_positions = jnp.broadcast_to(jnp.arange(S), (B, S)) if body_positions is None else body_positions
    P = t.prefix_k.shape[2]  # prefix slots (padded)

    # The prefix's keys/values for each sequence, then empty slots the body's forward writes into.
    def with_body_slots(c):
        layers, _, _, heads, dim = c.shape
        prefix = jnp.broadcast_to(c, (layers, B, P, heads, dim))
        return jnp.concatenate([prefix, jnp.zeros((layers, B, S, heads, dim), c.dtype)], axis=2)

    cache = KVCache(with_body_slots(t.prefix_k), with_body_slots(t.prefix_v))
    slots = jnp.arange(P + S)
    mask = (slots[None, :] < t.prefix_length) | ((slots[None, :] >= P) & (slots[None, :] - P <= jnp.arange(S)[:, None]))
    out = model(
        bodies,
        t.prefix_length + body_positions,
        jnp.broadcast_to(mask, (B, S, P + S)),
        cache=cache,
        cache_index=P,
        logits_positions=jnp.broadcast_to(t.answer_positions, (B, t.answer_positions.shape[0])),
    )
    return out.logits


def objective_value(t: ProblemTensors, logits, objective: str):
    """Per-sequence loss ``[B]`` to maximise: mean CE over the real answer tokens, or their summed
    KL(clean || permuted). Pad answer slots count for nothing."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    mask = t.answer_mask
    if objective == "ce":
        nll = -jnp.take_along_axis(logp, t.targets[None, :, None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(mask > 0, nll, 0.0), axis=-1) / jnp.sum(mask)
    clean = t.clean_logprobs
    kl = jnp.sum(jnp.exp(clean) * (clean - logp), axis=-1)
    return jnp.sum(jnp.where(mask > 0, kl, 0.0), axis=-1)


@functools.partial(jax.jit, static_argnames=("objective",))
def hard_losses(model: Transformer, t: ProblemTensors, row_perms, col_perms, objective: str = "ce"):
    """Objective ``[B]`` of hard permutations ``row_perms [B, N1-1]``, ``col_perms [B, M]`` (padded:
    ``AttackProblem.padded_orders``) in one batched forward."""
    bodies = jax.vmap(lambda r, c: hard_body(t, r, c))(row_perms, col_perms)
    return objective_value(t, answer_logits(model, t, bodies), objective)


def _positioned_losses(model: Transformer, t: ProblemTensors, row_perms, col_perms, positions_of, objective: str):
    bodies = jax.vmap(lambda r, c: hard_body(t, r, c))(row_perms, col_perms)
    positions = jax.vmap(positions_of)(row_perms, col_perms)
    return objective_value(t, answer_logits(model, t, bodies, positions), objective)


@functools.partial(jax.jit, static_argnames=("objective",))
def hard_losses_anchored(
    model: Transformer, t: ProblemTensors, row_perms, col_perms, anchor_rows, anchor_cols, objective: str = "ce"
):
    """Objective ``[B]`` of hard permutations (as ``hard_losses``) with every run of the body starting at the
    position id it has under the anchor order ``anchor_rows [N1-1]``, ``anchor_cols [M]``
    (``layout.anchored_positions``): what a reorder does through content alone, no token's position shifted."""
    return _positioned_losses(
        model,
        t,
        row_perms,
        col_perms,
        lambda r, c: anchored_positions(t.layout, r, c, anchor_rows, anchor_cols, body_length=t.body_length),
        objective,
    )


@functools.partial(jax.jit, static_argnames=("objective",))
def hard_losses_fixed_slots(model: Transformer, t: ProblemTensors, row_perms, col_perms, objective: str = "ce"):
    """Objective ``[B]`` of hard permutations (as ``hard_losses``) laid out in fixed slots, every cell slot as
    long as the longest cell (``layout.fixed_slot_positions``): a layout in which a reorder shifts no position,
    to be measured against the real prompt's losses."""
    return _positioned_losses(
        model,
        t,
        row_perms,
        col_perms,
        lambda r, c: fixed_slot_positions(t.layout, r, c, body_length=t.body_length),
        objective,
    )
