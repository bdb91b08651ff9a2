"""Evidence-aware structured attacks: the evidence read from a table, the placements, and the attacks' choices
against losses measured one re-rendered table at a time."""

import itertools

import numpy as np
import pytest
from conftest import SMALL

from atp_jax.attack import structured
from atp_jax.attack.presets import preset
from atp_jax.attack.problem import make_problem
from atp_jax.attack.run import attack
from atp_jax.inference.qa import answer_loss
from atp_jax.tables.evidence import find_evidence
from atp_jax.tables.table import Example

TABLE = SMALL.table
ROME = Example("Which team plays in Rome?", TABLE, ["bears"], "rome")
COUNT = Example("How many teams are listed?", TABLE, ["4"], "count")  # "4" is in no cell, no cell in the question


@pytest.fixture(scope="module")
def problem(sharp):
    return make_problem(sharp, ROME)


def test_evidence_is_the_answer_cell_and_the_cell_the_question_names():
    evidence = find_evidence(ROME)
    assert evidence.answer_cells == ((1, 0),)  # "Bears" normalises like the gold "bears"
    assert evidence.key_cells == ((1, 1),)  # "Rome" is a word of the question
    assert (evidence.rows, evidence.answer_columns, evidence.found) == ((1,), (0,), True)
    # Whole words only, and short cells ("1", "12") never count as keys.
    assert find_evidence(Example("Who plays in Romeo 12?", TABLE, ["x"], "w")).key_cells == ()
    assert not find_evidence(COUNT).found


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_move_block_puts_the_block_where_asked_and_keeps_every_other_order(n):
    for size in range(n + 1):
        for block in itertools.combinations(range(n), size):
            for where, expected_start in [("front", 0), ("middle", (n - size) // 2), ("end", n - size)]:
                order = structured.move_block(n, block, where)
                assert sorted(order) == list(range(n))
                assert list(order[expected_start : expected_start + size]) == list(block)
                assert [i for i in order if i not in block] == [i for i in range(n) if i not in block]


def test_candidates_are_distinct_placements_of_the_evidence():
    found = structured.candidates(find_evidence(ROME), 4, 3, "joint")
    orders = [(tuple(r), tuple(c)) for _, r, c in found]
    assert len(set(orders)) == len(orders) and ((0, 1, 2, 3), (0, 1, 2)) not in orders
    # Row 1 (the evidence) at the end, column 0 (the answer's) last: the first thing tried.
    assert found[0][0] == "rows_end+col_last" and orders[0] == ((0, 2, 3, 1), (1, 2, 0))
    # Row 1 is already in the middle and column 0 already first: placements that move nothing are dropped.
    assert [name for name, _, _ in found] == [
        "rows_end+col_last",
        "rows_front+col_last",
        "rows_end",
        "rows_front",
        "col_last",
    ]
    assert [name for name, _, _ in structured.candidates(find_evidence(ROME), 4, 3, "row")] == [
        "rows_end",
        "rows_front",
    ]
    # Nothing located: the reversals, for the dimensions the mode permutes.
    assert [name for name, _, _ in structured.candidates(find_evidence(COUNT), 4, 3, "joint")] == [
        "row_reverse",
        "col_reverse",
    ]


def test_structured_keeps_the_strongest_placement_measured_alone(sharp, problem):
    result = attack(sharp, ROME, preset("structured"), problem=problem)
    tried = structured.candidates(find_evidence(ROME), 4, 3, "joint")[:5]
    assert result.trace["candidates"] == [name for name, _, _ in tried]
    singles = [answer_loss(sharp, ROME, TABLE.permute(r, c)) for _, r, c in tried]
    assert result.queries == len(tried) and result.backward_calls == 0
    np.testing.assert_allclose(result.trace["losses"], singles, atol=1e-4)
    best = int(np.argmax(singles))
    assert (result.row_perm, result.col_perm) == (tuple(tried[best][1]), tuple(tried[best][2]))
    assert result.loss == pytest.approx(max(singles), abs=1e-4)


def test_structured_evolution_starts_from_the_placements_at_evolutions_budget(sharp, problem):
    result = attack(sharp, ROME, preset("structured_evolution"), problem=problem)
    assert result.method == "structured_evolution" and result.queries == 30
    seeds = structured.candidates(find_evidence(ROME), 4, 3, "joint")[:4]
    assert result.trace["candidates"] == [name for name, _, _ in seeds]
    # Elitism keeps the best of the first population, which holds every seed.
    strongest_seed = max(answer_loss(sharp, ROME, TABLE.permute(r, c)) for _, r, c in seeds)
    assert result.trace["best_per_generation"][0] >= strongest_seed - 1e-4
    assert result.loss >= strongest_seed - 1e-4
