"""Frank–Wolfe proposals: the linear oracle against a brute force over every permutation, and the attack's
budget, its first proposal and its moves against losses measured independently."""

import itertools

import numpy as np
import pytest
from conftest import SMALL

from atp_jax.attack import frank_wolfe
from atp_jax.attack.presets import preset
from atp_jax.attack.problem import make_problem
from atp_jax.attack.result import Evaluator
from atp_jax.attack.run import attack
from atp_jax.attack.search import order_gradients
from atp_jax.inference.qa import answer_loss

EXAMPLE = SMALL


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_linear_oracle_is_the_best_permutation_by_brute_force(k):
    G = np.random.default_rng(k).standard_normal((k, k))
    perm = frank_wolfe.linear_oracle(G)
    best = max(sum(G[a, p[a]] for a in range(k)) for p in itertools.permutations(range(k)))
    assert sorted(perm) == list(range(k))
    assert sum(G[a, perm[a]] for a in range(k)) == pytest.approx(best)


@pytest.fixture(scope="module")
def problem(sharp):
    return make_problem(sharp, EXAMPLE)


def test_the_attack_proposes_the_oracles_order_first_and_only_moves_up(sharp, problem):
    config = preset("frank_wolfe", seed=1)
    result = attack(sharp, EXAMPLE, config, problem=problem)
    assert result.queries <= 20 and result.backward_calls <= 2
    steps = result.trace["steps"]
    # Every step starts from the best loss so far: the current loss never falls.
    assert all(b["current"] >= a["current"] - 1e-6 for a, b in zip(steps, steps[1:]))
    assert result.loss >= result.clean_loss - 1e-4
    assert result.loss == pytest.approx(answer_loss(sharp, EXAMPLE, result.table), abs=1e-4)

    # The first batch's first proposal is the oracle's answer to the gradient at the original order.
    evaluator = Evaluator(sharp, problem)
    _, g_r, g_c = order_gradients(evaluator, *evaluator.identity)
    batch = frank_wolfe.proposals(
        *evaluator.identity, g_r, g_c, config, np.random.default_rng(0), set(), size=3, first=True
    )
    assert tuple(batch[0][0]) == tuple(frank_wolfe.linear_oracle(g_r))
    assert tuple(batch[0][1]) == tuple(frank_wolfe.linear_oracle(g_c))
    assert len({(tuple(r), tuple(c)) for r, c in batch}) == len(batch)


def test_controls_spend_the_same_budget(sharp, problem):
    spent = {}
    for name in ("frank_wolfe", "frank_wolfe_reversed", "frank_wolfe_random"):
        result = attack(sharp, EXAMPLE, preset(name, seed=2, noise=3.0), problem=problem)
        spent[name] = (result.queries, result.backward_calls)
    # A 4 x 3 table has 4! x 3! = 144 orders: the proposals never run dry, so each spends its whole budget.
    assert set(spent.values()) <= {(20, 1), (20, 2)}, spent
