"""Shape buckets: padding every attack tensor to a bucket changes no result, and a second example of a
bucket compiles nothing.

The reference is the unpadded run (``buckets=None``: every array at the example's own sizes) with the same
seed: every registered attack must choose the same order with the same losses (1e-5, float32), on tables
whose sizes sit exactly on a bucket edge in some dimensions and just over one in others, and in two
different buckets of the default grid.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import LARGE, SMALL, SMALL_TWIN, distinct_presets, run_binary

from atp_jax.attack.atp import _padded_normal, _padded_permutation
from atp_jax.attack.hungarian import project
from atp_jax.attack.presets import preset
from atp_jax.attack.problem import hard_losses, make_problem
from atp_jax.attack.result import Evaluator
from atp_jax.attack.run import attack
from atp_jax.attack.sinkhorn import entropy, sinkhorn
from atp_jax.compilation import compile_totals, disable_persistent_cache
from atp_jax.inference.qa import answer_losses
from atp_jax.tables.buckets import DEFAULT_BUCKETS, BucketGrid, Ladder, Sizes
from atp_jax.tables.layout import build_layout, pad_perms, place

CELL_SIZES = ("rows", "cols", "cell_tokens")
TEXT_SIZES = ("body", "prefix", "answer")


def edge_grid(sizes: Sizes, on_edge: tuple[str, ...]) -> BucketGrid:
    """A grid where the sizes named in ``on_edge`` sit exactly on a rung (no padding) and every other one is
    one over a rung (padded up to the next: about double)."""
    ladders = {}
    for name in CELL_SIZES + TEXT_SIZES:
        size = getattr(sizes, name)
        ladders[name] = Ladder(size) if name in on_edge else Ladder(size - 1)
    return BucketGrid(**ladders, text=ladders["body"], candidate_batch=8)


def _grids(tokenizer):
    """(case, example, grid): one table whose cell sizes sit on a bucket edge and text sizes just over one,
    and a larger one in another bucket of the default grid (which pads every size)."""
    small = build_layout(tokenizer, SMALL).sizes
    return {
        "cells on an edge, text just over": (SMALL, edge_grid(small, CELL_SIZES)),
        "default grid, larger table": (LARGE, DEFAULT_BUCKETS),
    }


@pytest.fixture(scope="module")
def problems(sharp):
    cache = {}

    def get(example, grid, objective):
        key = (example.id, grid, objective)
        if key not in cache:
            cache[key] = make_problem(sharp, example, objective=objective, buckets=grid)
        return cache[key]

    return get


def _assert_traces_match(padded, exact, where="", rtol=1e-6, atol=1e-5):
    if isinstance(exact, dict):
        assert padded.keys() == exact.keys(), where
        for key in exact:
            _assert_traces_match(padded[key], exact[key], f"{where}.{key}", rtol, atol)
    elif isinstance(exact, list) and exact and isinstance(exact[0], (list, dict)):
        assert len(padded) == len(exact), where
        for i, (p, e) in enumerate(zip(padded, exact)):
            _assert_traces_match(p, e, f"{where}[{i}]", rtol, atol)
    elif isinstance(exact, (int, bool, str)) or (isinstance(exact, list) and exact and isinstance(exact[0], str)):
        assert padded == exact, where
    elif where.split(".")[-1].startswith("entropy"):
        # θ itself, not a loss: Adam divides each gradient by its own size, so where the gradient nearly
        # cancels (the KL near its minimum) its float32 rounding moves θ by ~1e-5 relative.
        np.testing.assert_allclose(padded, exact, rtol=1e-4, err_msg=where)
    else:
        np.testing.assert_allclose(padded, exact, rtol=rtol, atol=atol, err_msg=where)


def test_ladders_and_the_grid_pad_up_never_down():
    assert [Ladder(64, 2).fit(x) for x in (1, 64, 65, 96, 97, 129, 200)] == [64, 64, 96, 96, 128, 192, 256]
    assert [Ladder(16).fit(x) for x in (3, 16, 17, 33)] == [16, 16, 32, 64]
    assert [Ladder(5).fit(x) for x in (5, 6, 11)] == [5, 10, 20]
    with pytest.raises(ValueError, match="multiple of the steps"):
        Ladder(63, 2)
    with pytest.raises(ValueError, match="candidate_batch"):
        BucketGrid(candidate_batch=0)
    real = Sizes(rows=5, cols=3, cell_tokens=3, runs=31, template=48, body=71, prefix=60, answer=2)
    padded = DEFAULT_BUCKETS.fit(real)
    assert padded == Sizes(rows=16, cols=8, cell_tokens=32, runs=257, template=96, body=96, prefix=64, answer=16)
    exact = BucketGrid(None, None, None, None, None, None, None)
    assert exact.fit(real) == real


@pytest.mark.parametrize("steps", [1, 2, 4, 8])
def test_length_steps_pad_each_length_to_the_smallest_rung_above_it(steps):
    """``with_length_steps`` against the rungs enumerated by hand: 64 · 2^k · (1 + j / steps)."""
    rungs = sorted({64 * 2**k * (steps + j) // steps for k in range(6) for j in range(steps)})
    grid = DEFAULT_BUCKETS.with_length_steps(steps)
    for length in range(1, rungs[-1] + 1):
        smallest = next(r for r in rungs if r >= length)
        assert grid.body.fit(length) == grid.prefix.fit(length) == grid.text_length(length) == smallest, length
    real = Sizes(rows=5, cols=3, cell_tokens=3, runs=31, template=500, body=554, prefix=70, answer=2)
    padded = grid.fit(real)
    assert (padded.body, padded.template, padded.prefix) == (next(r for r in rungs if r >= 554),) * 2 + (
        next(r for r in rungs if r >= 70),
    )
    # Only the lengths move: the cell sizes, the answer and the candidate batch stay the default grid's.
    default = DEFAULT_BUCKETS.fit(real)
    assert (padded.rows, padded.cols, padded.cell_tokens, padded.runs, padded.answer) == (
        default.rows,
        default.cols,
        default.cell_tokens,
        default.runs,
        default.answer,
    )
    assert grid.candidate_batch == DEFAULT_BUCKETS.candidate_batch


def test_two_length_steps_are_the_default_grid_and_others_must_divide_64():
    assert DEFAULT_BUCKETS.with_length_steps(2) == DEFAULT_BUCKETS
    assert DEFAULT_BUCKETS.with_length_steps(4).body.fit(554) == 640  # 768 on the default grid
    with pytest.raises(ValueError, match="multiple of the steps"):
        DEFAULT_BUCKETS.with_length_steps(3)


def test_sinkhorn_holds_pads_at_the_identity_and_gives_them_no_gradient():
    n, k = 5, 8
    theta = jax.random.normal(jax.random.key(0), (k, k)) * 2.0
    D = sinkhorn(theta, size=n)
    np.testing.assert_allclose(D[:n, :n], sinkhorn(theta[:n, :n]), atol=1e-6)
    np.testing.assert_array_equal(D[n:, n:], np.eye(k - n))
    assert not np.asarray(D[:n, n:]).any() and not np.asarray(D[n:, :n]).any()
    assert float(entropy(D)) == pytest.approx(float(entropy(sinkhorn(theta[:n, :n]))), abs=1e-5)
    weights = jax.random.normal(jax.random.key(1), (k, k))
    grad = jax.grad(lambda t: jnp.sum(weights * sinkhorn(t, size=n)))(theta)
    reference = jax.grad(lambda t: jnp.sum(weights[:n, :n] * sinkhorn(t)))(theta[:n, :n])
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_allclose(grad[:n, :n], reference, atol=1e-5)
    assert not np.asarray(grad[n:]).any() and not np.asarray(grad[:, n:]).any()


@pytest.mark.parametrize("method", ["host", "device"])
def test_hungarian_solves_the_real_block_and_keeps_pads_in_place(method):
    rng = np.random.default_rng(0)
    D = rng.standard_normal((3, 7, 7)).astype(np.float32)
    sizes = np.array([7, 4, 2], np.int32)
    batched = jax.jit(jax.vmap(lambda d, s: project(d, method, s)))(D, sizes)
    for b, s in enumerate(sizes):
        block = np.asarray(project(jnp.asarray(D[b, :s, :s]), method))
        np.testing.assert_array_equal(batched[b], np.concatenate([block, np.arange(s, 7)]))
    # An unbatched size under vmap (the restarts of one example) reaches the host with a size-1 axis.
    shared = jax.vmap(lambda d: project(d, method, 4))(D)
    for b in range(3):
        np.testing.assert_array_equal(shared[b, :4], project(jnp.asarray(D[b, :4, :4]), method))


def test_random_draws_do_not_depend_on_the_padding():
    key = jax.random.key(7)
    for n in (2, 5):
        normal = _padded_normal(key, n, n)
        np.testing.assert_array_equal(jax.random.normal(key, (n, n)), normal)  # unpadded: the plain draw
        perm = _padded_permutation(key, n, n)
        assert sorted(np.asarray(perm).tolist()) == list(range(n))
        for k in (n + 1, 2 * n + 3):
            padded = _padded_normal(key, k, n)
            np.testing.assert_array_equal(padded[:n, :n], normal)
            assert not np.asarray(padded[n:]).any() and not np.asarray(padded[:, n:]).any()
            np.testing.assert_array_equal(_padded_permutation(key, k, n), np.concatenate([perm, np.arange(n, k)]))


def test_padded_layout_places_the_same_tokens_and_pads_after_the_body(smollm2_tokenizer):
    layout = build_layout(smollm2_tokenizer, LARGE)
    sizes = DEFAULT_BUCKETS.fit(layout.sizes)
    rng = np.random.default_rng(0)
    rows, cols = rng.permutation(layout.n_rows), rng.permutation(layout.n_cols)
    exact = place(layout.arrays(np), rows, cols, **layout.static_sizes())
    padded = place(
        layout.arrays(np, sizes),
        pad_perms(rows, sizes.rows - 1),
        pad_perms(cols, sizes.cols),
        **layout.static_sizes(sizes),
    )
    tokens = layout.token_arrays(sizes)
    bank = np.concatenate(
        [
            tokens["template_ids"],
            tokens["cell_ids"][np.r_[0, pad_perms(rows, sizes.rows - 1) + 1]][:, pad_perms(cols, sizes.cols)].reshape(
                -1
            ),
        ]
    )
    S = layout.body_length
    np.testing.assert_array_equal(bank[padded[:S]], layout.ids(rows, cols)[layout.prefix_length :])
    assert (padded[S:] == 0).all() and len(padded) == sizes.body
    np.testing.assert_array_equal(exact, place(layout.arrays(np), rows, cols, **layout.static_sizes()))
    assert tokens["answer_mask"].sum() == layout.answer_length


def test_padded_hard_losses_equal_answer_losses_on_the_rerendered_text(sharp, problems):
    for example, grid in [(SMALL, DEFAULT_BUCKETS), (LARGE, DEFAULT_BUCKETS), (SMALL, None)]:
        problem = problems(example, grid, "ce")
        rng = np.random.default_rng(1)
        orders = [(rng.permutation(example.table.n_rows), rng.permutation(example.table.n_cols)) for _ in range(3)]
        rows, cols = problem.padded_orders([r for r, _ in orders], [c for _, c in orders])
        layout_losses = hard_losses(sharp.model, problem.tensors, jnp.asarray(rows), jnp.asarray(cols))
        tables = [example.table.permute(r, c) for r, c in orders]
        padded_text = answer_losses(sharp, example, tables, buckets=DEFAULT_BUCKETS)
        exact_text = answer_losses(sharp, example, tables, buckets=None)
        np.testing.assert_allclose(layout_losses, exact_text, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(padded_text, exact_text, rtol=1e-6, atol=1e-5)


def test_answer_losses_pad_batches_of_any_size_without_changing_them(sharp):
    rng = np.random.default_rng(2)
    tables = [LARGE.table.permute(rng.permutation(7), rng.permutation(6)) for _ in range(11)]
    padded = answer_losses(sharp, LARGE, tables, batch_size=4, buckets=DEFAULT_BUCKETS)
    exact = [answer_losses(sharp, LARGE, [t], buckets=None)[0] for t in tables]
    np.testing.assert_allclose(padded, exact, rtol=1e-6, atol=1e-5)


# ATP's random direction is drawn on the device over the padded size: its padding independence is tested too,
# and so are soft positions (expected cell lengths over the padded slots).
@pytest.mark.parametrize("name", [*distinct_presets(controls=("atp_st_random",)), "atp_joint@positions=soft"])
def test_every_attack_chooses_the_same_orders_padded_or_not(sharp, smollm2_tokenizer, problems, name):
    config = preset(name, seed=3)
    for case, (example, grid) in _grids(smollm2_tokenizer).items():
        padded_problem = problems(example, grid, config.objective)
        assert padded_problem.sizes != padded_problem.layout.sizes, case  # something is padded
        padded = attack(sharp, example, config, problem=padded_problem)
        exact = attack(sharp, example, config, problem=problems(example, None, config.objective))
        where = f"{name}, {case}"
        assert (padded.row_perm, padded.col_perm) == (exact.row_perm, exact.col_perm), where
        assert (padded.queries, padded.backward_calls) == (exact.queries, exact.backward_calls), where
        losses = ([padded.loss, padded.clean_loss], [exact.loss, exact.clean_loss])
        np.testing.assert_allclose(*losses, rtol=1e-6, atol=1e-5, err_msg=where)
        _assert_traces_match(padded.trace, exact.trace, where)


@pytest.fixture(scope="module")
def smollm2():
    from atp_jax import load_model

    return load_model("smollm2-135m-instruct")


@pytest.mark.parametrize(
    "name", ["best_of_k@k=10", "atp_st@n_attack=2,restarts=2", "atp_joint_kl@n_attack=2,restarts=2"]
)
def test_smollm2_attacks_choose_the_same_orders_padded_or_not(smollm2, name):
    """The real model, where losses and gradients carry real signal: sampling, ATP on CE and on KL."""
    from atp_jax.data.datasets import load_dataset

    example = load_dataset("sample")[3]
    config = preset(name, seed=1)
    padded, exact = (
        attack(
            smollm2, example, config, problem=make_problem(smollm2, example, objective=config.objective, buckets=grid)
        )
        for grid in (DEFAULT_BUCKETS, None)
    )
    assert (padded.row_perm, padded.col_perm, padded.queries) == (exact.row_perm, exact.col_perm, exact.queries)
    losses = ([padded.loss, padded.clean_loss], [exact.loss, exact.clean_loss])
    # 30 layers in float32: padding changes the matmuls' shapes and so their summation order, which moves a
    # CE of ~4 nats by up to ~1e-5 of itself and a KL of ~0.5 by up to ~2e-5 on some CPUs (the tiny models
    # above stay within 1e-6 relative and 1e-5 absolute).
    np.testing.assert_allclose(*losses, rtol=1e-5, atol=3e-5, err_msg=name)
    _assert_traces_match(padded.trace, exact.trace, name, rtol=1e-5, atol=3e-5)


@pytest.fixture
def no_persistent_cache():
    enabled = jax.config.jax_enable_compilation_cache
    disable_persistent_cache()
    yield
    jax.config.update("jax_enable_compilation_cache", enabled)


def test_a_second_example_of_the_same_bucket_compiles_no_new_program(sharp, no_persistent_cache):
    def work(example):
        problem = make_problem(sharp, example)
        evaluator = Evaluator(sharp, problem)
        rng = np.random.default_rng(0)
        for count in (1, 5, 12):  # one candidate batch size serves them all
            evaluator.losses(*zip(*[(rng.permutation(4), rng.permutation(3)) for _ in range(count)]))
        for name in ("atp_st", "paper", "search"):
            attack(sharp, example, preset(name), problem=problem)
        answer_losses(sharp, example, [example.table, example.table.permute([3, 2, 1, 0], None)])
        return problem

    first = work(SMALL)
    before = compile_totals()
    second = work(SMALL_TWIN)
    assert first.sizes == second.sizes and first.layout.sizes != second.layout.sizes
    assert (compile_totals() - before).programs == 0


def test_a_new_cell_bucket_with_a_known_prefix_bucket_reuses_the_prefix_program(sharp, no_persistent_cache):
    from atp_jax.attack.problem import _prefix_cache

    small = make_problem(sharp, SMALL)
    prefix_programs = _prefix_cache._cache_size()
    large = make_problem(sharp, LARGE)
    assert small.sizes.prefix == large.sizes.prefix and small.sizes != large.sizes
    assert _prefix_cache._cache_size() == prefix_programs  # a new bucket, but its prefix's program is known
    # (That the split changes no value: test_padded_hard_losses_equal_answer_losses_on_the_rerendered_text.)


def test_exact_sizes_keep_todays_candidate_batches(sharp):
    problem = make_problem(sharp, SMALL, buckets=None)
    assert problem.candidate_batches == (1, 2, 4, 8) and problem.sizes == problem.layout.sizes
    padded = make_problem(sharp, SMALL, buckets=dataclasses.replace(DEFAULT_BUCKETS, candidate_batch=32))
    assert padded.candidate_batches == (1, 32)  # one order alone does not pay for a full batch


def test_run_attack_records_the_same_results_with_or_without_buckets(tiny_checkpoint, tmp_path):
    """--nobuckets and --bucket_steps are compile-cost choices, not configurations: the records match and a
    folder made with buckets resumes without them; a --bucket_steps that makes no whole rungs is refused."""
    args = ["--model", tiny_checkpoint, "--num_examples", "2", "--nogenerate", "--nocompilation_cache"]
    args += ["--attacks", "vanilla,best_of_k@k=3,atp_st,search_warm", "--n_attack", "2", "--restarts", "2"]
    records = {}
    for folder, flag in (("padded", "--buckets"), ("exact", "--nobuckets"), ("finer", "--bucket_steps=4")):
        done = run_binary("run_attack", [*args, flag, "--output_dir", tmp_path / folder])
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (tmp_path / folder / "results.jsonl").read_text().splitlines()
        records[folder] = {(r["id"], r["attack"]): r for r in map(json.loads, lines)}
    assert records["padded"].keys() == records["exact"].keys() == records["finer"].keys()
    assert len(records["padded"]) == 8
    for key, exact in records["exact"].items():
        for padded in (records["padded"][key], records["finer"][key]):
            assert (padded["row_perm"], padded["col_perm"], padded["queries"]) == (
                exact["row_perm"],
                exact["col_perm"],
                exact["queries"],
            ), key
            assert padded["answer_loss"] == pytest.approx(exact["answer_loss"], abs=1e-5), key
    resumed = run_binary("run_attack", [*args, "--nobuckets", "--output_dir", tmp_path / "padded"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "8 recorded, 0 to run" in resumed.stdout
    refused = run_binary("run_attack", [*args, "--bucket_steps=3", "--output_dir", tmp_path / "padded"])
    assert refused.returncode != 0 and "--bucket_steps must divide 64" in refused.stderr
