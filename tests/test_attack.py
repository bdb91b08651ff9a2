"""The attack on a tiny random decoder with the real SmolLM2 tokenizer (fast, exact checks)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from atp_jax.attack import baselines
from atp_jax.attack.atp import ATPConfig, run_atp
from atp_jax.attack.hungarian import perm_to_matrix
from atp_jax.attack.presets import preset
from atp_jax.attack.problem import (
    AttackInputError,
    answer_logits,
    hard_losses,
    make_problem,
    objective_value,
    soft_body,
)
from atp_jax.attack.result import Evaluator
from atp_jax.attack.run import attack
from atp_jax.attack.search import predicted_swap_gains, swap_rank_correlation
from atp_jax.attack.sinkhorn import pin_header
from atp_jax.inference.qa import answer_loss
from atp_jax.tables.table import Example, Table

EXAMPLE = Example(
    "Which team was first?",
    Table(
        ["Team", "City", "Wins"],
        [["Lions", "Paris", "3"], ["Bears", "Rome", "12"], ["Owls", "Oslo", "7"], ["Foxes", "Lima", "1"]],
    ),
    ["Lions"],
    "toy",
)


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    loaded = tiny_llama()
    loaded.model.embed_tokens[...] = 20.0 * loaded.model.embed_tokens[...]  # sharper, order-sensitive logits
    return loaded


@pytest.fixture(scope="module")
def problem(tiny):
    return make_problem(tiny, EXAMPLE)


def test_hard_d_step_loss_equals_answer_loss_on_rerendered_table(tiny, problem):
    row_perm, col_perm = np.array([2, 0, 3, 1]), np.array([1, 2, 0])
    rows, cols = map(jnp.asarray, problem.padded_orders(row_perm, col_perm))  # the problem's shape bucket
    body = soft_body(problem.tensors, pin_header(perm_to_matrix(rows)), perm_to_matrix(cols), rows, cols)
    step_loss = float(objective_value(problem.tensors, answer_logits(tiny.model, problem.tensors, body[None]), "ce")[0])
    true = answer_loss(tiny, EXAMPLE, EXAMPLE.table.permute(row_perm, col_perm))
    assert abs(step_loss - true) < 1e-3
    batched = hard_losses(tiny.model, problem.tensors, rows[None], cols[None])
    assert abs(float(batched[0]) - true) < 1e-3


def test_vmapped_restarts_equal_sequential_runs(tiny, problem):
    cfg = ATPConfig(n_attack=3, restarts=3, init="random_perm", straight_through=True)
    keys = jax.random.split(jax.random.key(0), 3)
    trace, rows, cols = run_atp(tiny.model, problem.tensors, keys, cfg)
    single = dataclasses.replace(cfg, restarts=1)
    for r in range(3):
        trace_r, rows_r, cols_r = run_atp(tiny.model, problem.tensors, keys[r : r + 1], single)
        np.testing.assert_allclose(trace["loss"][r], trace_r["loss"][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(rows[r], rows_r[0])
        np.testing.assert_array_equal(cols[r], cols_r[0])


def test_same_seed_same_result_and_different_seed_differs(tiny, problem):
    cfg = ATPConfig(n_attack=3, restarts=2, init="random_perm", straight_through=True, keep_best=True, seed=4)
    a = attack(tiny, EXAMPLE, cfg, problem=problem)
    b = attack(tiny, EXAMPLE, cfg, problem=problem)
    assert (a.row_perm, a.col_perm, a.loss, a.trace["loss"]) == (b.row_perm, b.col_perm, b.loss, b.trace["loss"])
    c = attack(tiny, EXAMPLE, dataclasses.replace(cfg, seed=5), problem=problem)
    assert c.trace["loss"] != a.trace["loss"]


def test_paper_preset_runs_and_counts_calls(tiny, problem):
    result = attack(tiny, EXAMPLE, preset("paper", n_attack=4), problem=problem)
    assert sorted(result.row_perm) == [0, 1, 2, 3] and sorted(result.col_perm) == [0, 1, 2]
    assert result.queries == 4 and result.backward_calls == 4
    assert result.loss == pytest.approx(answer_loss(tiny, EXAMPLE, result.table), abs=1e-6)
    assert np.isfinite(result.trace["objective"]).all()


def test_row_and_col_modes_leave_the_other_dimension_alone(tiny, problem):
    row = attack(tiny, EXAMPLE, preset("paper", mode="row", n_attack=2, init="random_perm"), problem=problem)
    col = attack(tiny, EXAMPLE, preset("paper", mode="col", n_attack=2, init="random_perm"), problem=problem)
    assert row.col_perm == (0, 1, 2) and col.row_perm == (0, 1, 2, 3)


def test_best_of_k_is_the_brute_force_maximum_of_its_samples(tiny, problem):
    evaluator = Evaluator(tiny, problem)
    result = baselines.best_of_k(evaluator, np.random.default_rng(0), k=6)
    rows, cols = baselines.random_orders(Evaluator(tiny, problem), np.random.default_rng(0), 6)
    singles = [answer_loss(tiny, EXAMPLE, EXAMPLE.table.permute(r, c)) for r, c in zip(rows, cols)]
    assert result.queries == 6
    assert result.loss == pytest.approx(max(singles), abs=1e-4)


def test_evolution_uses_thirty_queries_and_keeps_valid_orders(tiny, problem):
    result = baselines.evolution(Evaluator(tiny, problem), np.random.default_rng(1))
    assert result.queries == 30
    best = result.trace["best_per_generation"]
    assert all(later >= earlier for earlier, later in zip(best, best[1:]))  # elitism
    assert sorted(result.row_perm) == [0, 1, 2, 3]


def test_order_crossover_yields_permutations():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = rng.integers(1, 9)
        child = baselines.order_crossover(rng.permutation(k), rng.permutation(k), rng)
        assert sorted(child) == list(range(k))


def test_predicted_swap_gains_match_first_order_brute_force():
    rng = np.random.default_rng(0)
    G = rng.standard_normal((5, 5))
    perm = rng.permutation(5)
    pairs, gains = predicted_swap_gains(G, perm)
    P = np.eye(5)[perm]
    for (a, b), gain in zip(pairs, gains):
        swapped = perm.copy()
        swapped[[a, b]] = swapped[[b, a]]
        assert gain == pytest.approx(np.sum(G * (np.eye(5)[swapped] - P)))


def test_search_and_controls_spend_the_same_budget(tiny, problem):
    results = [
        attack(tiny, EXAMPLE, preset(name, n_attack=1, candidates=4), problem=problem)
        for name in ("search", "search_reversed", "search_random")
    ]
    assert [(r.queries, r.backward_calls) for r in results] == [(5, 1)] * 3
    assert all(r.loss >= r.clean_loss - 1e-6 for r in results)  # the search never returns a worse order


def test_swap_rank_correlation_reports_all_swaps(tiny, problem):
    stats = swap_rank_correlation(Evaluator(tiny, problem))
    assert stats["swaps"] == 6 + 3  # C(4,2) row swaps + C(3,2) column swaps
    assert -1.0 <= stats["spearman"] <= 1.0


def test_unattackable_examples_give_clear_errors(tiny):
    with pytest.raises(AttackInputError, match="1x1 table has no order"):
        make_problem(tiny, Example("q", Table(["a"], [["1"]]), ["1"], "one"))
    with pytest.raises(AttackInputError, match="no reference answer"):
        make_problem(tiny, Example("q", EXAMPLE.table, [], "none"))
    with pytest.raises(AttackInputError, match="over the limit"):
        make_problem(tiny, EXAMPLE, max_seq_length=20)
    single_row = Example("q", Table(["a", "b"], [["1", "2"]]), ["1"], "row")
    with pytest.raises(AttackInputError, match="one data row"):
        attack(tiny, single_row, preset("paper", mode="row"))
    result = attack(tiny, single_row, preset("paper", mode="col", n_attack=2))  # columns still permutable
    assert sorted(result.col_perm) == [0, 1]


def test_warm_search_shares_start_and_budget_with_its_controls(tiny, problem):
    results = [
        attack(tiny, EXAMPLE, preset(name), problem=problem)
        for name in ("search_warm", "search_warm_reversed", "search_warm_random")
    ]
    # 1 original + 8 random starts, 1 gradient, then the 9 single swaps this 4x3 table has: 19 forwards.
    assert [(r.queries, r.backward_calls) for r in results] == [(19, 1)] * 3
    best_start = results[0].trace["steps"][0]["current"]  # loss of the best starting order
    assert all(r.loss >= best_start - 1e-4 for r in results)


def test_presets_that_differ_only_in_values_share_one_compile(tiny, problem):
    from atp_jax.attack.atp import _run_atp
    from atp_jax.attack.presets import preset

    names = ["atp_joint", "atp_row", "atp_col", "atp_st_reversed", "atp_st_random"]
    results = {}
    # The gradient's presets share one program, the two controls another (their steering is not in the first).
    for first in ("atp_joint", "atp_st_reversed"):
        attack(tiny, EXAMPLE, preset(first), problem=problem)  # compiles (or finds) the shared programs
    before = _run_atp._cache_size()
    for name in names:
        results[name] = attack(tiny, EXAMPLE, preset(name, seed=7), problem=problem)
    assert _run_atp._cache_size() == before
    # The values still act: modes keep the other axis, controls change the path.
    assert results["atp_row"].col_perm == tuple(range(EXAMPLE.table.n_cols))
    assert results["atp_col"].row_perm == tuple(range(EXAMPLE.table.n_rows))
    assert results["atp_st_reversed"].trace["objective"] != results["atp_joint"].trace["objective"]


def test_the_controls_steering_is_a_program_of_its_own(tiny, problem):
    from atp_jax.attack.atp import _run_atp

    def programs_after(name):
        attack(tiny, EXAMPLE, preset(name, n_attack=5, sinkhorn_iters=7, restarts=2), problem=problem)  # this test only
        return _run_atp._cache_size()

    gradient = programs_after("atp_joint")
    assert programs_after("atp_st_reversed") == gradient + 1  # the steering compiled for the controls alone
    assert programs_after("atp_st_random") == gradient + 1
    assert programs_after("paper") == gradient + 1


@pytest.mark.parametrize("init", ["uniform", "identity", "random_perm"])
def test_both_thetas_drawn_at_once_equal_each_drawn_alone(init):
    from atp_jax.attack.atp import _init_theta, _init_thetas, _settings

    s = _settings(ATPConfig(init=init, init_noise=0.5))
    key = jax.random.key(3)
    n, m, n_rows, n_cols = 9, 5, 7, 4  # padded sizes, real sizes
    both = _init_thetas(key, n, m, jnp.asarray([n_rows, n_cols]), s)
    row_key, col_key = jax.random.split(key)
    np.testing.assert_array_equal(both["row"], _init_theta(row_key, n, n_rows, s))
    np.testing.assert_array_equal(both["col"], _init_theta(col_key, m, n_cols, s))


def test_the_random_controls_directions_drawn_at_once_equal_each_drawn_alone():
    from atp_jax.attack.atp import _steer

    key = jax.random.key(3)
    n, m, n_rows, n_cols = 9, 5, 7, 4  # padded sizes, real sizes
    # Each matrix's direction is the one drawn alone over its real block, at the gradient's norm.
    grads = {"row": jnp.ones((n, n)), "col": 2 * jnp.ones((m, m))}
    steered = _steer(grads, jnp.int32(2), key, {"row": n_rows, "col": n_cols})
    col_draw_key, row_draw_key = jax.random.split(key)  # keys follow the tree's order: col, row
    for name, draw_key, size, real in (("row", row_draw_key, n, n_rows), ("col", col_draw_key, m, n_cols)):
        z = np.asarray(jax.random.normal(draw_key, (size * size,)))[: real * real].reshape(real, real)
        expected = z * np.linalg.norm(grads[name]) / np.linalg.norm(z)
        np.testing.assert_allclose(np.asarray(steered[name])[:real, :real], expected, rtol=1e-5)
        assert not np.asarray(steered[name])[real:].any() and not np.asarray(steered[name])[:, real:].any()


@pytest.mark.parametrize("name", ["atp_st", "paper"])
def test_one_option_changes_each_change_one_option_at_the_same_budget(name):
    from atp_jax.attack.presets import attack_names, one_option_changes

    base = preset(name)
    variants = one_option_changes(name)
    fields = {f.name for f in dataclasses.fields(ATPConfig)}
    # What one option may move (λ moves both weights and maybe the schedule; folding restarts changes the
    # steps per restart).
    moves = {
        "init": {"init"},
        "straight_through": {"straight_through"},
        "keep_best": {"keep_best"},
        "lambda": {"lambda_row", "lambda_col", "lambda_schedule"},
        "lambda_schedule": {"lambda_schedule"},
        "lr": {"lr"},
        "positions": {"positions"},
        "restarts": {"restarts", "n_attack"},
    }
    seen = set()
    for spec, config in variants.items():
        changed = {f for f in fields if getattr(config, f) != getattr(base, f)}
        options = {option for option, allowed in moves.items() if changed and changed <= allowed}
        assert options, (spec, changed)
        seen |= options
        assert config.restarts * config.n_attack == base.restarts * base.n_attack, spec
        assert preset(spec) == config  # the name is the configuration
    assert attack_names(variants) == list(variants)  # every name is a valid, canonical --attacks entry
    assert set(moves) - seen <= {"lambda_schedule"}  # every option is ablated
    assert variants[f"{name}@init=identity"].init == "identity"
    with pytest.raises(ValueError, match="the options belong to ATP"):
        one_option_changes("best_of_k")


def test_canonical_specs_round_trip_through_preset():
    from atp_jax.attack.presets import PRESETS, canonical

    for name in PRESETS:
        assert canonical(name) == name
    # Sorted, typed, overrides equal to the preset's own value dropped, bools written on/off.
    assert canonical("paper@n_attack=40,lr=0.5,lambda_row=1") == "paper@lambda_row=1.0,lr=0.5,n_attack=40"
    assert canonical("atp_st@n_attack=5,init=uniform") == "atp_st@init=uniform"
    assert canonical("paper@straight_through=true") == "paper@straight_through=on"
    assert canonical("paper", lambda_row=1, lambda_col=1) == "paper@lambda_col=1.0,lambda_row=1.0"
    for spec in ("paper@lambda_row=1.0,lr=0.5,n_attack=40", "atp_st@keep_best=off", "best_of_k@k=5"):
        assert canonical(spec) == spec
        assert preset(canonical(spec)) == preset(spec)
    with pytest.raises(ValueError, match="has no field k"):
        preset("atp_st", k=3)  # a field of another method


def test_a_preset_name_carries_field_overrides():
    from atp_jax.attack.presets import attack_names

    assert preset("atp_st@init=uniform") == dataclasses.replace(preset("atp_st"), init="uniform")
    both = preset("paper@straight_through=on,n_attack=40,lr=0.5")
    assert (both.straight_through, both.n_attack, both.lr) == (True, 40, 0.5)
    assert preset("atp_st@keep_best=off", seed=3) == dataclasses.replace(preset("atp_st"), keep_best=False, seed=3)
    assert attack_names(["atp_st@init=uniform", "vanilla", "atp_st@init=uniform"]) == ["atp_st@init=uniform", "vanilla"]
    # --attacks is a comma list: NAME@a=1,b=2 arrives split after a=1 and is joined back.
    assert attack_names(["vanilla", "evolution@population=3", "generations=1", "best_of_k@k=4"]) == [
        "vanilla",
        "evolution@generations=1,population=3",
        "best_of_k@k=4",
    ]
    for bad, message in (
        ("atp_st@init", "'init' is not field=value"),
        ("atp_st@colour=red", "'colour=red' is not"),
        ("atp_st@keep_best=maybe", "keep_best='maybe' is not a valid bool"),
        ("atp_st@n_attack=x", "n_attack='x' is not a valid int"),
        ("atp_st@init=diagonal", "ATPConfig.init='diagonal'"),
        ("nope@init=uniform", "nope"),
    ):
        with pytest.raises(ValueError, match=message):
            attack_names([bad])


def test_a_step_projects_both_dimensions_in_one_host_call(tiny, host_assign_calls):
    """Rows and columns share one Sinkhorn loop and one host Hungarian call per step (and one for the final
    orders), for all restarts at once: a round trip to the host is what a step waits for on an accelerator."""
    problem = make_problem(tiny, EXAMPLE, buckets=None)  # a shape no other test traces: this run traces anew
    config = preset("atp_joint", n_attack=3, restarts=2)
    jax.clear_caches()
    result = attack(tiny, EXAMPLE, config, problem=problem)
    assert len(host_assign_calls) == config.n_attack + 1
    assert all(shape[:2] == (config.restarts, 2) for shape in host_assign_calls)  # [R, rows and columns, k, k]
    # The columns' order (3 of them, padded to the rows' 4) is still a permutation of its own entries.
    assert sorted(result.col_perm) == [0, 1, 2] and sorted(result.row_perm) == [0, 1, 2, 3]


def test_the_original_orders_loss_is_measured_once_per_problem(tiny, monkeypatch):
    """Every result reports the original order's loss beside its own; attacks sharing a problem measure it once."""
    from atp_jax.attack import result as result_module

    measured = []
    real = result_module.answer_losses

    def counting(loaded, example, tables, *args, **kwargs):
        measured.extend(tables)
        return real(loaded, example, tables, *args, **kwargs)

    monkeypatch.setattr(result_module, "answer_losses", counting)
    problem = make_problem(tiny, EXAMPLE)
    results = [
        attack(tiny, EXAMPLE, preset(name), problem=problem) for name in ("vanilla", "row_reverse", "col_reverse")
    ]
    assert sum(table == EXAMPLE.table for table in measured) == 1
    assert len({r.clean_loss for r in results}) == 1
    assert abs(results[0].clean_loss - answer_loss(tiny, EXAMPLE)) < 1e-5
