"""Searching attacks against best-of-j at their own compute, from one large best-of-K record: budgets per
question, the expectation against every j-subset of the K recorded orders enumerated, what is left out, the
refusals, and the report binary's section."""

import itertools
import json

import numpy as np
import pytest
from conftest import run_binary

from atp_jax.runs.records import append_record
from atp_jax.runs.sampled_budget import sampled_budget_rows

REFERENCE = "best_of_k@k=4"
LOSSES = {"q1": [0.0, 1.0, 2.0, 3.0], "q2": [1.0, 0.5, 0.25, 4.0], "q3": [2.0, 2.0, 1.0, 0.0], "q4": [0.0] * 4}


def brute_best_of(values, j):
    return np.mean([max(c) for c in itertools.combinations(values, j)])


def records():
    out = [
        {"id": q, "attack": REFERENCE, "answer_loss": max(v), "queries": 4, "trace": {"losses": v}}
        for q, v in LOSSES.items()
    ]
    # evolution spends 2 forwards on q1..q3 and 9 (more than K) on q4
    for q, loss, queries in [("q1", 2.5, 2), ("q2", 1.0, 2), ("q3", 3.0, 2), ("q4", 1.0, 9)]:
        out.append({"id": q, "attack": "evolution", "answer_loss": loss, "queries": queries, "backward_calls": 0})
    # a gradient attack: 1 forward + 1 backward at 1.5 forwards = 2.5, rounded up to 3
    for q in ["q1", "q2", "q3"]:
        out.append({"id": q, "attack": "atp_joint", "answer_loss": 2.0, "queries": 1, "backward_calls": 1})
    # neither searches: left out
    out.append({"id": "q1", "attack": "row_reverse", "answer_loss": 9.0, "queries": 1})
    out.append({"id": "q1", "attack": "best_of_k", "answer_loss": 9.0, "queries": 20})
    out.append({"id": "q1", "attack": "frank_wolfe", "skipped": "too long"})
    return out


def test_each_question_at_its_own_budget():
    rows = {r["attack"]: r for r in sampled_budget_rows(records(), REFERENCE, backward_cost=1.5)}
    assert set(rows) == {"evolution", "atp_joint"}

    evolution = rows["evolution"]
    expected = [
        2.5 - brute_best_of(LOSSES["q1"], 2),
        1.0 - brute_best_of(LOSSES["q2"], 2),
        3.0 - brute_best_of(LOSSES["q3"], 2),
    ]
    assert evolution["examples"] == 3 and evolution["over_budget"] == 1  # q4's 9 forwards exceed K = 4
    assert evolution["mean_difference"] == pytest.approx(np.mean(expected))
    assert evolution["mean_budget"] == 2 and evolution["higher"] == sum(d > 0 for d in expected)
    assert evolution["ci_low"] <= evolution["mean_difference"] <= evolution["ci_high"]

    gradient = rows["atp_joint"]
    assert gradient["mean_budget"] == 3 and gradient["over_budget"] == 0
    assert gradient["mean_difference"] == pytest.approx(
        np.mean([2.0 - brute_best_of(LOSSES[q], 3) for q in ["q1", "q2", "q3"]])
    )
    # a backward priced at one forward: budget 2, so best-of-2, lower, is what it must beat
    cheaper = {r["attack"]: r for r in sampled_budget_rows(records(), REFERENCE, backward_cost=1.0)}["atp_joint"]
    assert cheaper["mean_budget"] == 2 and cheaper["mean_difference"] > gradient["mean_difference"]


def test_refusals():
    with pytest.raises(ValueError, match="must be a best_of_k spec"):
        sampled_budget_rows(records(), "evolution", 1.5)
    with pytest.raises(ValueError, match="unknown attack"):
        sampled_budget_rows(records(), "best_of_zz", 1.5)
    with pytest.raises(ValueError, match="not recorded"):
        sampled_budget_rows(records(), "best_of_k@k=54", 1.5)
    short = [{**r, "trace": {"losses": r["trace"]["losses"][:3]}} if r["attack"] == REFERENCE else r for r in records()]
    with pytest.raises(ValueError, match="recorded 3 order losses, not 4"):
        sampled_budget_rows(short, REFERENCE, 1.5)


def test_report_section(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"model": "small", "dataset": "wtq", "seed": 0, "attacks": {}}))
    for r in records():
        append_record(folder / "results.jsonl", {"clean_loss": 0.0, "scores": {}, "seconds": 1.0, **r})
    done = run_binary(
        "report", ["--results", str(folder), "--compare", "--sampled_reference", REFERENCE, "--backward_cost", "1.5"]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"against best-of-j at each question's compute, from {REFERENCE}" in done.stdout
    assert "| evolution | 3 | 2.0 |" in done.stdout and "| atp_joint | 3 | 3.0 |" in done.stdout
    done = run_binary("report", ["--results", str(folder), "--compare", "--sampled_reference", "evolution"])
    assert done.returncode != 0 and "--sampled_reference evolution" in done.stderr and "best_of_k spec" in done.stderr
