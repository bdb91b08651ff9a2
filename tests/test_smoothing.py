"""Permutation smoothing: canonical order, draws, vote, smoothed answers, run_one/run_attack/report wiring.

Expected values are worked out by hand from the small tables and records below."""

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from atp_jax.attack.presets import preset
from atp_jax.defense.smoothing import (
    SmoothedAnswer,
    SmoothingConfig,
    canonical_order,
    smoothed_answers,
    smoothing_tables,
    vote,
)
from atp_jax.inference.qa import answers
from atp_jax.runs.defense_report import defense_metric, defense_rows, defense_table
from atp_jax.runs.experiment import run_one
from atp_jax.runs.records import append_record
from atp_jax.tables.normalize import normalize_wtq
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example, Table

REPO = Path(__file__).resolve().parents[1]

TABLE = Table(
    ["Team", "City", "Wins"],
    [["Lions", "Paris", "3"], ["Bears", "Rome", "12"], ["Owls", "Oslo", "7"], ["Foxes", "Lima", "1"]],
)
EXAMPLE = Example("Which team was first?", TABLE, ["Lions"], "toy", dataset="wtq")
# Two columns share the header "x" and the cells {1, 2, 3} in other arrangements: sorting columns by
# (header, cells) cannot order them, and the two arrangements give different sorted rows.
TIED = Table(["x", "y", "x"], [["1", "a", "2"], ["2", "b", "3"], ["3", "a", "1"]])


def random_orders(table, count, seed):
    rng = np.random.default_rng(seed)
    return [(rng.permutation(table.n_rows), rng.permutation(table.n_cols)) for _ in range(count)]


def content(table):
    """The rows as multisets of (header, cell) pairs: equal for any row and column order."""
    return Counter(tuple(sorted(zip(table.header, row))) for row in table.rows)


# --------------------------------------------------------------------------- canonical order and draws


def test_canonical_order_sorts_columns_by_header_and_rows_by_cells():
    table = Table(["b", "a"], [["2", "y"], ["1", "z"], ["1", "x"]])
    rows, cols = canonical_order(table)
    assert table.permute(rows, cols).cells == (("a", "b"), ("x", "1"), ("y", "2"), ("z", "1"))


def test_canonical_order_of_tied_columns_takes_the_smallest_sorted_rows():
    # Arrangement (first x, second x): rows (1,2,a), (2,3,b), (3,1,a); the other one sorts to
    # (1,3,a), (2,1,a), (3,2,b). The first is smaller, whatever the arrival order.
    want = (("x", "x", "y"), ("1", "2", "a"), ("2", "3", "b"), ("3", "1", "a"))
    for rows, cols in itertools.product(itertools.permutations(range(3)), itertools.permutations(range(3))):
        arrived = TIED.permute(rows, cols)
        assert arrived.permute(*canonical_order(arrived)).cells == want


def test_too_many_tied_columns_is_a_clear_error_and_canonical_false_still_works():
    # Nine columns "x", each a rotation of 0..8: 9! = 362880 distinct arrangements, over the 8! limit.
    wide = Table(["x"] * 9, [[str((i + j) % 9) for j in range(9)] for i in range(9)])
    with pytest.raises(ValueError, match="362880 column arrangements.*canonical=False"):
        smoothing_tables(wide, SmoothingConfig(k=2))
    drawn = smoothing_tables(wide, SmoothingConfig(k=2, canonical=False))
    assert [content(t) for t in drawn] == [content(wide)] * 2


@pytest.mark.parametrize("table", [TABLE, TIED], ids=["plain", "tied_columns"])
@pytest.mark.parametrize("include_original", [False, True])
def test_canonical_draws_do_not_depend_on_the_arrival_order(table, include_original):
    config = SmoothingConfig(k=6, include_original=include_original, seed=3)
    reference = [t.cells for t in smoothing_tables(table, config)]
    for rows, cols in random_orders(table, 8, seed=1):
        arrived = table.permute(rows, cols)
        drawn = [t.cells for t in smoothing_tables(arrived, config)]
        if include_original:
            assert drawn[0] == arrived.cells  # the attacker's vote: the only order-dependent table
            drawn, want = drawn[1:], reference[1:]
        else:
            want = reference
        assert drawn == want


def test_non_canonical_draws_follow_the_arrival_order_and_start_with_it():
    config = SmoothingConfig(k=4, canonical=False, include_original=True)
    drawn = smoothing_tables(TABLE, config)
    assert len(drawn) == 5 and drawn[0] == TABLE
    rows, cols = [3, 1, 0, 2], [2, 0, 1]
    arrived = TABLE.permute(rows, cols)
    other = smoothing_tables(arrived, config)
    assert other[0] == arrived
    assert [t.cells for t in other[1:]] != [t.cells for t in drawn[1:]]  # σ_i ∘ arrival order


@pytest.mark.parametrize("canonical", [True, False])
def test_every_draw_is_a_permutation_of_the_content(canonical):
    arrived = TABLE.permute([2, 0, 3, 1], [1, 2, 0])
    drawn = smoothing_tables(arrived, SmoothingConfig(k=12, canonical=canonical, seed=5))
    assert len(drawn) == 12
    for t in drawn:
        assert t.cells[0] == t.header and sorted(t.header) == sorted(TABLE.header)
        assert content(t) == content(TABLE)
    assert len({t.cells for t in drawn}) > 1  # the orders do vary


def test_draws_are_uniform_over_row_orders():
    # One column, three rows: 6 row orders, 1200 draws, about 200 each (binomial sd ≈ 13).
    table = Table(["v"], [["a"], ["b"], ["c"]])
    drawn = smoothing_tables(table, SmoothingConfig(k=1200, seed=7))
    counts = Counter(t.rows for t in drawn)
    assert len(counts) == 6
    assert all(140 < c < 260 for c in counts.values()), counts


def test_fewer_votes_are_a_prefix_of_more():
    few = smoothing_tables(TABLE, SmoothingConfig(k=3, seed=2))
    many = smoothing_tables(TABLE, SmoothingConfig(k=9, seed=2))
    assert few == many[:3]
    assert smoothing_tables(TABLE, SmoothingConfig(k=3, seed=4)) != few  # the seed matters


def test_config_is_checked():
    with pytest.raises(ValueError, match="k=0"):
        SmoothingConfig(k=0)
    with pytest.raises(TypeError, match="bool"):
        SmoothingConfig(k=True)
    with pytest.raises(ValueError, match="seed=-1"):
        SmoothingConfig(k=1, seed=-1)


# --------------------------------------------------------------------------- vote


def test_normalize_wtq_merges_case_and_a_final_period_only():
    # What the vote relies on (see metrics.normalize_wtq): not all punctuation goes.
    assert normalize_wtq("Alice") == normalize_wtq("alice.") == "alice"
    assert normalize_wtq("Alice!") != "alice"


def test_vote_majority_tie_and_normalization():
    assert vote(["a", "b", "b"]) == ("b", pytest.approx(2 / 3))
    assert vote(["b", "a", "a", "b"]) == ("b", 0.5)  # tie: b was voted first
    assert vote(["Bob", "alice.", "Alice"]) == ("alice.", pytest.approx(2 / 3))  # first text of the winner
    assert vote(["Alice!", "Bob", "bob"]) == ("Bob", pytest.approx(2 / 3))
    assert vote(["x"]) == ("x", 1.0)
    with pytest.raises(ValueError, match="at least one"):
        vote([])
    with pytest.raises(TypeError, match="single string"):
        vote("abc")


# --------------------------------------------------------------------------- with a tiny random model


@pytest.fixture
def first_row_answerer(monkeypatch):
    """A stand-in for the model that is as order-sensitive as can be: it answers the team in the first
    data row (the tiny random model below answers the same text under every order)."""

    def fake_answers(loaded, example, tables, style, max_new_tokens):
        return [t.rows[0][t.header.index("Team")] for t in tables]

    monkeypatch.setattr("atp_jax.defense.smoothing.answers", fake_answers)


def test_canonical_smoothing_defeats_an_order_sensitive_answerer(first_row_answerer):
    config = SmoothingConfig(k=9)
    reference = smoothed_answers(None, EXAMPLE, TABLE, config, ks=(1, 9))
    assert len(set(reference[9].votes)) > 1  # the answerer does follow the order
    for rows, cols in random_orders(TABLE, 10, seed=2):
        assert smoothed_answers(None, EXAMPLE, TABLE.permute(rows, cols), config, ks=(1, 9)) == reference


def test_the_arrival_order_moves_the_weaker_variants(first_row_answerer):
    teams = [row[0] for row in TABLE.rows]
    # include_original: the arrival order's vote comes first and wins every tie; with k=1 it always wins.
    config = SmoothingConfig(k=1, include_original=True)
    for i, team in enumerate(teams):
        arrived = TABLE.permute([i, *(j for j in range(4) if j != i)])
        assert smoothed_answers(None, EXAMPLE, arrived, config)[1].prediction == team
    # canonical=False: each arrival order reads the same σ_1 from a different start.
    config = SmoothingConfig(k=1, canonical=False)
    got = {
        smoothed_answers(None, EXAMPLE, TABLE.permute(rows), config)[1].prediction
        for rows in itertools.permutations(range(4))
    }
    assert got == set(teams)


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    # Untied embeddings: this random model writes a few words (a tied one only writes newlines).
    return tiny_llama(tie_word_embeddings=False)


STYLE = PromptStyle()


def test_smoothed_answers_do_not_depend_on_the_arrival_order(tiny):
    config = SmoothingConfig(k=4)
    reference = smoothed_answers(tiny, EXAMPLE, TABLE, config, STYLE, 4, ks=(1, 4))
    assert list(reference) == [1, 4] and len(reference[4].votes) == 4 and reference[4].prediction
    for rows, cols in random_orders(TABLE, 2, seed=11):
        assert smoothed_answers(tiny, EXAMPLE, TABLE.permute(rows, cols), config, STYLE, 4, ks=(1, 4)) == reference


def test_each_k_votes_over_a_prefix_of_one_generation(tiny):
    config = SmoothingConfig(k=5, canonical=False, include_original=True, seed=1)
    arrived = TABLE.permute([1, 3, 0, 2], [2, 1, 0])
    tables = smoothing_tables(arrived, config)
    raw = answers(tiny, EXAMPLE, tables, STYLE, 4)  # the same batch smoothed_answers generates
    got = smoothed_answers(tiny, EXAMPLE, arrived, config, STYLE, 4, ks=(1, 3, 5))
    assert got[1].votes == (raw[0], raw[1])  # the arrival order's answer, then the first draw's
    assert got[3].votes == tuple(raw[:4]) and got[5].votes == tuple(raw)
    for k in (1, 3, 5):
        answer = got[k]
        forms = Counter(normalize_wtq(v) for v in answer.votes)
        assert answer.prediction in answer.votes
        assert forms[normalize_wtq(answer.prediction)] == max(forms.values())
        assert answer.agreement == pytest.approx(max(forms.values()) / (k + 1))


def test_first_vote_is_the_answer_under_the_first_draw(tiny):
    config = SmoothingConfig(k=3)
    (first, *_) = smoothing_tables(TABLE, config)
    got = smoothed_answers(tiny, EXAMPLE, TABLE, config, STYLE, 4, ks=(1, 3))
    assert got[1] == SmoothedAnswer(got[3].votes[0], 1.0, (got[3].votes[0],))
    assert got[1].prediction == answers(tiny, EXAMPLE, smoothing_tables(TABLE, config), STYLE, 4)[0]
    assert first == smoothing_tables(TABLE, SmoothingConfig(k=1))[0]


def test_smoothed_answers_checks_ks(tiny):
    config = SmoothingConfig(k=3)
    with pytest.raises(ValueError, match="config.k=3"):
        smoothed_answers(tiny, EXAMPLE, TABLE, config, STYLE, 4, ks=(1, 5))
    with pytest.raises(ValueError, match=r"ks\[0\]=0"):
        smoothed_answers(tiny, EXAMPLE, TABLE, config, STYLE, 4, ks=(0,))
    with pytest.raises(ValueError, match="empty"):
        smoothed_answers(tiny, EXAMPLE, TABLE, config, STYLE, 4, ks=())


def test_run_one_records_the_defense_on_the_chosen_order(tiny):
    config = SmoothingConfig(k=3)
    record = run_one(
        tiny,
        EXAMPLE,
        "row_reverse",
        preset("row_reverse"),
        STYLE,
        max_new_tokens=4,
        smoothing=config,
        smoothing_ks=(1, 3),
    ).as_dict()
    assert record["row_perm"] == [3, 2, 1, 0]
    assert set(record["defended"]) == {"smooth_k1", "smooth_k3"} and record["defense_seconds"] >= 0
    want = smoothed_answers(tiny, EXAMPLE, TABLE.permute([3, 2, 1, 0]), config, STYLE, 4, ks=(1, 3))
    for k in (1, 3):
        entry = record["defended"][f"smooth_k{k}"]
        assert entry["prediction"] == want[k].prediction and entry["agreement"] == want[k].agreement
        want_accuracy = 1.0 if normalize_wtq(want[k].prediction) == "lions" else 0.0
        assert entry["scores"] == {"accuracy": want_accuracy}
    plain = run_one(tiny, EXAMPLE, "row_reverse", preset("row_reverse"), STYLE, max_new_tokens=4).as_dict()
    assert "defended" not in plain and "defense_seconds" not in plain
    with pytest.raises(ValueError, match="generate=True"):
        run_one(tiny, EXAMPLE, "row_reverse", preset("row_reverse"), STYLE, generate=False, smoothing=config)


# --------------------------------------------------------------------------- run_attack flags


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--smoothing_k", "0"], "'0' is not a vote count"),
        (["--smoothing_k", "1,two"], "'two' is not a vote count"),
        (["--smoothing_k", "3", "--nogenerate"], "--smoothing_k needs --generate"),
    ],
    ids=["zero", "not_int", "nogenerate"],
)
def test_run_attack_rejects_bad_smoothing_flags_before_loading_a_model(tmp_path, flags, message):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "atp_jax.cli.run_attack",
            "--model",
            str(tmp_path / "missing.gguf"),
            "--output_dir",
            str(out),
            "--distributed",
            "off",
            *flags,
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert message in done.stderr
    assert "missing.gguf" not in done.stderr  # no model load was tried
    assert not out.exists()  # it stopped before creating the results folder


# --------------------------------------------------------------------------- report


def rec(id_, attack, accuracy, defended):
    return {
        "id": id_,
        "attack": attack,
        "answer_loss": 1.0,
        "clean_loss": 1.0,
        "scores": {"accuracy": accuracy},
        "row_perm": [0],
        "col_perm": [0],
        "prediction": "x",
        "queries": 1,
        "backward_calls": 0,
        "seconds": 0.1,
        "defended": {
            f"smooth_k{k}": {"prediction": "x", "scores": {"accuracy": a}, "agreement": g}
            for k, (a, g) in defended.items()
        },
    }


RECORDS = [
    rec("e1", "vanilla", 1.0, {5: (1.0, 0.6), 1: (0.0, 1.0), 10: (1.0, 0.5)}),
    rec("e2", "vanilla", 0.0, {1: (1.0, 1.0), 5: (1.0, 0.8), 10: (0.0, 0.9)}),
    rec("e1", "paper", 0.0, {1: (0.0, 1.0), 5: (1.0, 0.4), 10: (1.0, 0.4)}),
    {"id": "e2", "attack": "paper", "skipped": "one data row"},
    {**rec("e3", "vanilla", 1.0, {}), "defended": {}},  # no defense measured: left out of the table
]


def test_defense_rows_by_hand():
    rows = defense_rows(RECORDS)
    assert [list(r) for r in rows] == [["attack", "examples", "undefended", "k=1", "k=5", "k=10", "agreement k=10"]] * 2
    vanilla, paper = rows
    assert vanilla == pytest.approx(
        {
            "attack": "vanilla",
            "examples": 2,
            "undefended": 0.5,
            "k=1": 0.5,
            "k=5": 1.0,
            "k=10": 0.5,
            "agreement k=10": 0.7,
        }
    )
    assert paper == pytest.approx(
        {
            "attack": "paper",
            "examples": 1,
            "undefended": 0.0,
            "k=1": 0.0,
            "k=5": 1.0,
            "k=10": 1.0,
            "agreement k=10": 0.4,
        }
    )


def test_defense_table_markdown():
    text = defense_table(RECORDS)
    assert text.startswith("mean accuracy: undefended vs. permutation smoothing")
    assert "| attack | examples | undefended | k=1 | k=5 | k=10 | agreement k=10 |" in text
    assert "| vanilla | 2 | 0.500 | 0.500 | 1.000 | 0.500 | 0.700 |" in text
    assert "| paper | 1 | 0.000 | 0.000 | 1.000 | 1.000 | 0.400 |" in text
    assert defense_table(RECORDS[3:]) == "(no defended records)"
    assert defense_metric(RECORDS) == "accuracy"
    with pytest.raises(ValueError, match="'f1' is not recorded in the defended answers"):
        defense_table(RECORDS, "f1")


def test_report_binary_prints_the_defense_section(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"model": "m1", "dataset": "wtq"}))
    for r in RECORDS:
        append_record(folder / "results.jsonl", r)
    done = subprocess.run(
        [sys.executable, "-m", "atp_jax.cli.report", "--results", str(folder)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"### wtq: m1, permutation smoothing ({folder})" in done.stdout
    assert "| vanilla | 2 | 0.500 | 0.500 | 1.000 | 0.500 | 0.700 |" in done.stdout
