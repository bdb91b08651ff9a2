"""A swap's effect split into content and position shift: the anchored positions against a brute-force layout of
the runs, and the anchored loss against the whole prompt run through the model with those position ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from atp_jax.attack.problem import make_problem
from atp_jax.attack.result import Evaluator
from atp_jax.attack.search import swap_rank_correlation
from atp_jax.tables.layout import anchored_positions, build_layout
from atp_jax.tables.table import Example, Table

# Cells of different token lengths, so that most swaps shift the tokens between them.
EXAMPLE = Example(
    "Which team plays in Rome?",
    Table(
        ["Team", "City"],
        [["Lions", "Paris"], ["Bears of the North", "Rome"], ["Owls", "Oslo and Bergen"], ["Foxes", "Lima"]],
    ),
    ["Bears of the North"],
    "lengths",
)
SWAPPED = (np.array([2, 1, 0, 3]), np.array([1, 0]))


def brute_force_positions(layout, rows, cols) -> np.ndarray:
    """Body position ids from the runs themselves: run k of the new order starts where run k started in the
    original one and counts on."""
    new_lengths, _, _ = layout.runs(rows, cols)
    old_lengths, _, _ = layout.runs()
    starts = np.cumsum(old_lengths) - old_lengths
    return np.concatenate([start + np.arange(length) for start, length in zip(starts, new_lengths)])


def test_anchored_positions_follow_the_original_runs(smollm2_tokenizer):
    layout = build_layout(smollm2_tokenizer, EXAMPLE)
    arrays, body = layout.arrays(np), layout.body_length
    ident = np.arange(4), np.arange(2)

    def anchored(rows, cols):
        return anchored_positions(arrays, rows, cols, *ident, body_length=body)

    np.testing.assert_array_equal(anchored(*ident), np.arange(body))
    np.testing.assert_array_equal(anchored(*SWAPPED), brute_force_positions(layout, *SWAPPED))
    assert not np.array_equal(anchored(*SWAPPED), np.arange(body))  # lengths differ: ids overlap or skip
    # The JAX path (as jitted) gives the same ids.
    as_jax = anchored_positions(
        layout.arrays(jnp), *map(jnp.asarray, SWAPPED), *map(jnp.asarray, ident), body_length=body
    )
    np.testing.assert_array_equal(np.asarray(as_jax), anchored(*SWAPPED))


def test_anchored_loss_is_the_whole_prompt_with_those_position_ids(sharp):
    layout = build_layout(sharp.tokenizer, EXAMPLE)
    problem = make_problem(sharp, EXAMPLE)
    evaluator = Evaluator(sharp, problem)
    anchored, moved = (
        evaluator.losses(*(o[None] for o in SWAPPED), anchor=(np.arange(4), np.arange(2)))[0],
        evaluator.losses(*(o[None] for o in SWAPPED))[0],
    )

    ids = layout.ids(*SWAPPED)
    prefix = len(layout.prefix_ids)
    positions = np.concatenate([np.arange(prefix), prefix + brute_force_positions(layout, *SWAPPED)])
    logits = sharp.model(sharp.model.embed(jnp.asarray([ids])), jnp.asarray([positions]), jnp.ones((1, len(ids)), bool))
    logp = np.asarray(jax.nn.log_softmax(logits.logits[0].astype(jnp.float32), axis=-1))
    answer = layout.answer_ids
    start = len(ids) - len(answer)
    reference = -np.mean([logp[start - 1 + k, token] for k, token in enumerate(answer)])
    assert anchored == pytest.approx(reference, abs=1e-4)
    assert abs(anchored - moved) > 1e-3  # the shift matters in this example, so the test tells the two apart


def test_decomposition_adds_up_and_equal_length_swaps_shift_nothing(sharp):
    evaluator = Evaluator(sharp, make_problem(sharp, EXAMPLE))
    stats = swap_rank_correlation(evaluator, decompose=True)
    assert stats["swaps"] == 6 + 1 and evaluator.queries == 2 * stats["swaps"]
    assert 0 < stats["shift_share"] < 1 and stats["mean_abs_shift"] > 0
    assert -1 <= stats["spearman_change_content"] <= 1 and -1 <= stats["spearman_predicted_content"] <= 1

    # Rows 0 and 3 ("Lions | Paris", "Foxes | Lima") have the same token counts: swapping them shifts no position.
    layout = build_layout(sharp.tokenizer, EXAMPLE)
    lengths = layout.cell_lengths
    assert (lengths[1] == lengths[4]).all()
    rows, cols = np.array([[3, 1, 2, 0]]), np.array([[0, 1]])
    content = evaluator.losses(rows, cols, anchor=(np.arange(4), np.arange(2)))
    np.testing.assert_allclose(content, evaluator.losses(rows, cols), atol=1e-6)


def test_soft_positions_interpolate_the_run_starts_of_the_orders_mixed(sharp):
    from atp_jax.attack.hungarian import perm_to_matrix
    from atp_jax.attack.problem import soft_positions
    from atp_jax.attack.sinkhorn import pin_header

    layout = build_layout(sharp.tokenizer, EXAMPLE)
    problem = make_problem(sharp, EXAMPLE, buckets=None)
    rows, cols = np.arange(4), np.arange(2)
    swapped = np.array([2, 1, 0, 3])
    for eps in (0.0, 0.3):
        D_r = (1 - eps) * perm_to_matrix(jnp.asarray(rows)) + eps * perm_to_matrix(jnp.asarray(swapped))
        ids = soft_positions(problem.tensors, pin_header(D_r), perm_to_matrix(jnp.asarray(cols)), rows, cols)
        # By hand: the hard order's runs, each starting at the mix of its starts under the two orders.
        here, _, _ = layout.runs(rows, cols)
        there, _, _ = layout.runs(swapped, cols)
        start = (1 - eps) * (np.cumsum(here) - here) + eps * (np.cumsum(there) - there)
        expected = np.concatenate([s + np.arange(n) for s, n in zip(start, here)])
        np.testing.assert_allclose(np.asarray(ids), expected, atol=1e-4)


def test_soft_position_gradients_and_atp_run_from_the_same_hard_forward(sharp):
    from atp_jax.attack.atp import run_atp
    from atp_jax.attack.presets import preset
    from atp_jax.attack.search import order_gradients

    problem = make_problem(sharp, EXAMPLE)
    evaluator = Evaluator(sharp, problem)
    rows, cols = np.arange(4), np.arange(2)
    hard_value, hard_r, _ = order_gradients(evaluator, rows, cols)
    soft_value, soft_r, _ = order_gradients(evaluator, rows, cols, positions="soft")
    assert soft_value == pytest.approx(hard_value, abs=1e-5)  # at a vertex the positions are the hard ones
    assert np.abs(soft_r - hard_r).max() > 1e-4  # ...but the gradient sees how they would move
    stats = swap_rank_correlation(Evaluator(sharp, problem), soft_positions=True)
    assert -1 <= stats["spearman_soft_positions"] <= 1

    # Straight-through: each step's forward is the hard order's, whatever the positions' relaxation.
    config = preset("atp_joint", positions="soft", n_attack=3, restarts=2)
    trace, _, _ = run_atp(sharp.model, problem.tensors, jax.random.split(jax.random.key(0), 2), config)
    visited_rows = np.asarray(trace["row_perm"]).reshape(-1, trace["row_perm"].shape[-1])[:, :4]
    visited_cols = np.asarray(trace["col_perm"]).reshape(-1, trace["col_perm"].shape[-1])[:, :2]
    exact = evaluator.losses(visited_rows, visited_cols)
    np.testing.assert_allclose(np.asarray(trace["loss"]).reshape(-1), exact, atol=1e-4)
    assert np.isfinite(np.asarray(trace["objective"])).all()
