"""Relaxations that see positions (#17 items 2b, 2c): the fixed-slot layout against a brute-force layout of the
runs and against the whole prompt run through the model with those ids; the relaxation's value and gradient at a
soft order against the prompt's embeddings mixed by hand; the smoothed ranking's cost."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_swap_decomposition import EXAMPLE, SWAPPED

from atp_jax.attack.problem import make_problem
from atp_jax.attack.result import Evaluator
from atp_jax.attack.search import order_gradients, swap_rank_correlation
from atp_jax.tables.buckets import BucketGrid
from atp_jax.tables.layout import build_layout, fixed_slot_positions, pad_perms

IDENTITY = (np.arange(4), np.arange(2))


def brute_force_slot_positions(layout, rows, cols) -> np.ndarray:
    """Every cell's run given as many ids as the longest cell, template runs their own; each token counts on
    from its run's start."""
    lengths, row, _ = layout.runs(rows, cols)
    slot = np.where(row >= 0, layout.cell_lengths.max(), lengths)
    starts = np.cumsum(slot) - slot
    return np.concatenate([start + np.arange(n) for start, n in zip(starts, lengths)])


def test_fixed_slot_positions_by_brute_force(smollm2_tokenizer):
    layout = build_layout(smollm2_tokenizer, EXAMPLE)
    body = layout.body_length
    for order in (IDENTITY, SWAPPED):
        ids = fixed_slot_positions(layout.arrays(np), *order, body_length=body)
        np.testing.assert_array_equal(ids, brute_force_slot_positions(layout, *order))
        as_jax = fixed_slot_positions(layout.arrays(jnp), *map(jnp.asarray, order), body_length=body)
        np.testing.assert_array_equal(np.asarray(as_jax), ids)
    # Padded to a bucket (pad cells, pad runs): the real tokens keep their ids.
    sizes = BucketGrid().fit(layout.sizes)
    assert sizes.rows > layout.sizes.rows and sizes.runs > layout.sizes.runs
    orders = pad_perms(SWAPPED[0], sizes.rows - 1), pad_perms(SWAPPED[1], sizes.cols)
    padded = fixed_slot_positions(layout.arrays(np, sizes), *orders, body_length=sizes.body)
    np.testing.assert_array_equal(padded[:body], brute_force_slot_positions(layout, *SWAPPED))


def _answer_ce(loaded, layout, embeds, positions) -> float:
    """CE of the reference answer for the whole prompt's input embeddings ``[S, D]`` at position ids ``[S]``."""
    S = len(positions)
    causal = jnp.arange(S)[None, :] <= jnp.arange(S)[:, None]
    logits = loaded.model(jnp.asarray(embeds)[None], jnp.asarray(positions)[None], causal[None]).logits[0]
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
    answer = layout.answer_ids
    start = S - len(answer)
    return float(-np.mean([logp[start - 1 + k, token] for k, token in enumerate(answer)]))


def test_fixed_slot_loss_is_the_whole_prompt_with_those_ids(sharp):
    layout = build_layout(sharp.tokenizer, EXAMPLE)
    evaluator = Evaluator(sharp, make_problem(sharp, EXAMPLE))
    slots = evaluator.losses(*(o[None] for o in SWAPPED), fixed_slots=True)[0]
    ids = layout.ids(*SWAPPED)
    prefix = len(layout.prefix_ids)
    positions = np.concatenate([np.arange(prefix), prefix + brute_force_slot_positions(layout, *SWAPPED)])
    reference = _answer_ce(sharp, layout, sharp.model.embed(jnp.asarray(ids)), positions)
    assert slots == pytest.approx(reference, abs=1e-4)
    assert abs(slots - evaluator.losses(*(o[None] for o in SWAPPED))[0]) > 1e-3  # the gaps change the loss
    with pytest.raises(ValueError, match="not both"):
        evaluator.losses(*(o[None] for o in SWAPPED), anchor=IDENTITY, fixed_slots=True)


def test_fixed_slot_losses_padded_equal_unpadded(sharp):
    orders = np.stack([IDENTITY[0], SWAPPED[0]]), np.stack([IDENTITY[1], SWAPPED[1]])
    padded = Evaluator(sharp, make_problem(sharp, EXAMPLE)).losses(*orders, fixed_slots=True)
    exact = Evaluator(sharp, make_problem(sharp, EXAMPLE, buckets=None)).losses(*orders, fixed_slots=True)
    np.testing.assert_allclose(padded, exact, atol=1e-5)


def _mixed_prompt(loaded, layout, D_r, D_c):
    """The prompt's input embeddings ``[S, D]`` under soft orders, by hand: the original order's layout, each
    token of cell slot (a, b) the mix Σ D_r[a, i] D_c[b, j] × token of cell (i, j) at the same offset (a cell
    shorter than that offset adds nothing); the header row pinned."""
    full_r = np.eye(len(D_r) + 1)
    full_r[1:, 1:] = D_r
    embed = np.asarray(loaded.model.embed(jnp.asarray(layout.ids())))
    cell_embeds = np.asarray(loaded.model.embed(jnp.asarray(layout.cell_ids)))
    cell_embeds = cell_embeds * (layout.cell_lengths[..., None] > np.arange(layout.max_cell_tokens))[..., None]
    out = embed.copy()
    t = len(layout.prefix_ids)
    lengths, row, col = layout.runs()
    for n, a, b in zip(lengths, row, col):
        if a >= 0:
            mixed = np.einsum("i,ijkd,j->kd", full_r[a], cell_embeds, D_c[b])
            out[t : t + n] = mixed[:n]
        t += n
    return out


def test_gradient_at_a_soft_order_against_the_prompt_mixed_by_hand(sharp):
    layout = build_layout(sharp.tokenizer, EXAMPLE)
    evaluator = Evaluator(sharp, make_problem(sharp, EXAMPLE))
    P_r, P_c = np.eye(4), np.eye(2)
    Q_r, Q_c = np.eye(4)[SWAPPED[0]], np.eye(2)[SWAPPED[1]]
    D_r, D_c = 0.7 * P_r + 0.3 * Q_r, 0.8 * P_c + 0.2 * Q_c
    value, g_r, g_c = order_gradients(evaluator, *IDENTITY, at=(D_r, D_c))

    positions = np.arange(len(layout.ids()))

    def by_hand(D_r, D_c):
        return _answer_ce(sharp, layout, _mixed_prompt(sharp, layout, D_r, D_c), positions)

    assert value == pytest.approx(by_hand(D_r, D_c), abs=1e-4)
    # The gradient against central differences of the hand-made loss along a random direction.
    rng = np.random.default_rng(0)
    E_r, E_c = rng.standard_normal((4, 4)), rng.standard_normal((2, 2))
    h = 1e-2
    numeric = (by_hand(D_r + h * E_r, D_c + h * E_c) - by_hand(D_r - h * E_r, D_c - h * E_c)) / (2 * h)
    assert np.sum(g_r * E_r) + np.sum(g_c * E_c) == pytest.approx(numeric, rel=2e-2, abs=2e-3)
    # At the order's own one-hot matrices it is the vertex gradient.
    at_vertex = order_gradients(evaluator, *IDENTITY, at=(P_r, P_c))
    vertex = order_gradients(evaluator, *IDENTITY)
    for a, b in zip(at_vertex, vertex):
        np.testing.assert_allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="positions must be one of"):
        order_gradients(evaluator, *IDENTITY, positions="fractional")


def test_swap_ranking_with_fixed_slots_and_smoothing(sharp):
    problem = make_problem(sharp, EXAMPLE)
    evaluator = Evaluator(sharp, problem)
    stats = swap_rank_correlation(evaluator, fixed_slots=True, smooth_samples=3, smooth_scale=0.3, seed=1)
    swaps = stats["swaps"]
    # the real swaps, the fixed-slot swaps and the fixed-slot original order
    assert evaluator.queries == 2 * swaps + 1
    for key in (
        "spearman_fixed_slot_change",
        "spearman_fixed_slot_predicted",
        "spearman_fixed_slot_predicted_true",
        "spearman_smoothed",
    ):
        assert -1 <= stats[key] <= 1
    slots = Evaluator(sharp, problem).losses(*(o[None] for o in IDENTITY), fixed_slots=True)[0]
    real = Evaluator(sharp, problem).losses(*(o[None] for o in IDENTITY))[0]
    assert stats["fixed_slot_loss_gap"] == pytest.approx(slots - real, abs=1e-5)
    # The same seed draws the same soft orders: the smoothed ranking repeats.
    again = swap_rank_correlation(Evaluator(sharp, problem), smooth_samples=3, smooth_scale=0.3, seed=1)
    assert again["spearman_smoothed"] == pytest.approx(stats["spearman_smoothed"], abs=1e-6)
