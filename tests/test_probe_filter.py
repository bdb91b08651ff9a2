"""A cheap model as a filter: the pairing of two models' best-of-k orders checked with the real attack on two
different models, the exact expectation against enumerating every draw, the filter's rows by hand, and the
report's refusals."""

import itertools
import json

import numpy as np
import pytest
from conftest import SMALL, run_binary

from atp_jax.attack.presets import preset
from atp_jax.attack.run import attack
from atp_jax.inference.qa import answer_loss
from atp_jax.runs.probe_filter import filter_rows, order_agreement, paired_order_losses
from atp_jax.runs.records import append_record


def record(id_, losses, rows=(0, 1), cols=(0,)):
    best = int(np.argmax(losses))
    # the chosen order encodes its index, so that two records' orders agree exactly when their argmaxes do
    return {
        "id": id_,
        "attack": "best_of_k",
        "answer_loss": float(max(losses)),
        "row_perm": list(rows),
        "col_perm": list(cols) + [best],
        "trace": {"losses": list(losses)},
    }


def test_two_models_score_the_same_orders(tiny_llama, sharp):
    """The pairing the filter rests on: run best-of-k on two different models with one seed, and the expensive
    model's own loss of the cheap model's chosen order is the expensive trace's loss at the cheap argmax."""
    config = preset("best_of_k", seed=3, k=6)
    cheap, expensive = attack(tiny_llama(seed=1), SMALL, config), attack(sharp, SMALL, config)
    as_record = lambda r: {  # noqa: E731
        "id": SMALL.id,
        "attack": "best_of_k",
        "row_perm": list(r.row_perm),
        "col_perm": list(r.col_perm),
        "trace": r.trace,
    }
    pairs = paired_order_losses([as_record(cheap)], [as_record(expensive)])
    la, lb = pairs[SMALL.id]
    assert len(la) == len(lb) == 6 and not np.allclose(la, lb)  # two models, one set of orders
    assert lb[int(np.argmax(la))] == pytest.approx(answer_loss(sharp, SMALL, cheap.table), abs=1e-4)


def test_filter_rows_by_hand():
    cheap = {
        "q1": np.array([0.0, 3.0, 1.0, 2.0]),
        "q2": np.array([5.0, 1.0, 0.0, 2.0]),
        "q3": np.array([1.0, 2.0, 3.0, 0.0]),
    }
    expensive = {
        "q1": np.array([4.0, 1.0, 2.0, 3.0]),
        "q2": np.array([1.0, 2.0, 3.0, 4.0]),
        "q3": np.array([0.0, 1.0, 5.0, 2.0]),
    }
    pairs = {i: (cheap[i], expensive[i]) for i in cheap}
    rows = {r["filter_top_j"]: r for r in filter_rows(pairs, keep=(1, 2, 5), cheap_cost=0.25)}
    assert set(rows) == {1, 2}  # j = 5 > k is left out
    # j = 1 costs 1 + 4 × 0.25 = 2 forwards: the cheap top pick against the expected best of 2 random orders.
    picks = {"q1": 1.0, "q2": 1.0, "q3": 5.0}
    fair2 = {i: np.mean([max(p) for p in itertools.combinations(expensive[i], 2)]) for i in expensive}
    diffs = [picks[i] - fair2[i] for i in sorted(cheap)]
    assert rows[1]["mean_gain"] == pytest.approx(np.mean(diffs))
    assert rows[1]["wins"] == f"{sum(d > 0 for d in diffs)}/3"
    assert rows[1]["random_best_of"] == "2"
    # j = 2 costs 3 forwards: top two of the cheap ranking.
    picks2 = {"q1": max(1.0, 3.0), "q2": max(1.0, 4.0), "q3": max(5.0, 1.0)}
    fair3 = {i: np.mean([max(p) for p in itertools.combinations(expensive[i], 3)]) for i in expensive}
    assert rows[2]["mean_gain"] == pytest.approx(np.mean([picks2[i] - fair3[i] for i in sorted(cheap)]))
    # A filter dearer than k orders is compared with all k and says so.
    capped = filter_rows(pairs, keep=(2,), cheap_cost=1.0)[0]
    assert capped["random_best_of"] == "4 (capped at k; fair: 6)"


def test_agreement_is_spearman_per_question():
    pairs = {"a": (np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])), "b": (np.arange(3.0), -np.arange(3.0))}
    out = order_agreement(pairs)
    assert out["per_question"] == {"a": pytest.approx(1.0), "b": pytest.approx(-1.0)}
    assert out["positive"] == "1/2" and out["median_spearman"] == pytest.approx(0.0)


def test_pairing_refuses_what_cannot_pair():
    ok = record("q", [0.0, 2.0, 1.0])
    assert set(paired_order_losses([ok], [record("q", [3.0, 1.0, 0.5]), record("x", [1.0, 0.0, 0.0])])) == {"q"}
    with pytest.raises(ValueError, match="scored 3 orders .* and 4"):
        paired_order_losses([ok], [record("q", [0.0, 1.0, 2.0, 3.0])])
    with pytest.raises(ValueError, match="table"):
        paired_order_losses([ok], [record("q", [0.0, 2.0, 1.0], rows=(0, 1, 2))])
    # the same index chosen but another order (or the same order at another index): not the same draw
    with pytest.raises(ValueError, match="same --seed"):
        paired_order_losses([ok], [{**record("q", [0.0, 2.0, 1.0]), "col_perm": [0, 7]}])


def _folder(path, model, records, seed=0, k=3):
    path.mkdir()
    spec = {"method": "best_of_k", "mode": "joint", "k": k, "seed": seed}
    (path / "run.json").write_text(
        json.dumps({"model": model, "dataset": "wtq", "seed": seed, "attacks": {"best_of_k": spec}})
    )
    for r in records:
        append_record(
            path / "results.jsonl",
            {**r, "clean_loss": 0.0, "scores": {}, "queries": k, "backward_calls": 0, "seconds": 1.0},
        )
    return path


def test_report_probe_filter(tmp_path):
    ids = [f"q{i}" for i in range(4)]
    rng = np.random.default_rng(0)
    cheap_losses = {i: rng.standard_normal(3) for i in ids}
    cheap = _folder(tmp_path / "cheap", "small", [record(i, cheap_losses[i]) for i in ids])
    same = _folder(tmp_path / "same", "big", [record(i, 2 * cheap_losses[i]) for i in ids])
    done = run_binary("report", ["--results", f"{cheap},{same}", "--probe_filter", "--cheap_cost", "0", "--noci"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "small as a filter for big" in done.stdout and "median +1.000, positive on 4/4" in done.stdout
    # a perfect filter at no cost: its top pick is the best order, which beats a random one
    assert "| 1 | 1.000 | 1 | 4 |" in done.stdout and "| 4/4 |" in done.stdout

    other_seed = _folder(tmp_path / "seed1", "big", [record(i, cheap_losses[i]) for i in ids], seed=1)
    done = run_binary("report", ["--results", f"{cheap},{other_seed}", "--probe_filter"])
    assert done.returncode != 0 and "different --seed" in done.stderr
    other_k = _folder(tmp_path / "k4", "big", [record(i, cheap_losses[i]) for i in ids], k=4)
    done = run_binary("report", ["--results", f"{cheap},{other_k}", "--probe_filter"])
    assert done.returncode != 0 and "draws the same way" in done.stderr
    done = run_binary("report", ["--results", str(cheap), "--probe_filter"])
    assert done.returncode != 0 and "two results folders" in done.stderr
