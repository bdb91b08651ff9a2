"""Choosing the strongest attack on half the questions and confirming it on the other: the split, the rule that
the worst victim decides, no leak from the confirmation half into the choice, the target, the refusals and the
report binary's section. Expected differences come from best-of-j enumerated over every j-subset."""

import itertools
import json

import numpy as np
import pytest
from conftest import REPO, run_binary

from atp_jax.attack.presets import preset
from atp_jax.runs.folders import load_run
from atp_jax.runs.records import append_record
from atp_jax.runs.strongest import choose_strongest, split_questions

REFERENCE = "best_of_k@k=4"
ORDER_LOSSES = [0.0, 1.0, 2.0, 3.0]
IDS = [f"q{i}" for i in range(8)]
BEST_OF_2 = np.mean([max(c) for c in itertools.combinations(ORDER_LOSSES, 2)])  # each attack spends 2 forwards


def folder_records(losses: dict[str, dict[str, float]]) -> list[dict]:
    """Records of one victim: the reference on every question, and ``losses[attack][id]`` at 2 forwards."""
    out = [
        {"id": q, "attack": REFERENCE, "answer_loss": 3.0, "queries": 4, "trace": {"losses": ORDER_LOSSES}} for q in IDS
    ]
    for attack, by_id in losses.items():
        out += [
            {"id": q, "attack": attack, "answer_loss": v, "queries": 2, "backward_calls": 0} for q, v in by_id.items()
        ]
    return out


def everywhere(value: float) -> dict[str, float]:
    return dict.fromkeys(IDS, value)


def test_split_is_a_seeded_partition():
    choice, confirm = split_questions(IDS + IDS[:3], seed=0)
    assert (
        len(choice) == len(confirm) == 4 and set(choice) | set(confirm) == set(IDS) and not set(choice) & set(confirm)
    )
    assert split_questions(IDS, seed=0) == (choice, confirm)
    assert any(split_questions(IDS, seed=s)[0] != choice for s in range(1, 6))
    assert len(split_questions(IDS[:7], seed=0)[0]) == 3


def test_the_worst_victim_decides_and_the_other_half_confirms():
    first = folder_records(
        {"evolution": everywhere(3.5), "structured": everywhere(9.0), "frank_wolfe": everywhere(2.0)}
    )
    second = folder_records(
        {"evolution": everywhere(3.5), "structured": everywhere(0.0), "frank_wolfe": everywhere(2.0)}
    )
    choice = choose_strongest([first, second], REFERENCE, [1.5, 1.5])
    # structured has the larger mean over victims (+2.17 against +1.17) but loses on the second: evolution wins.
    assert choice.attack == "evolution"
    assert set(choice.choice_rows) == {"evolution", "structured", "frank_wolfe"}
    assert choice.choice_rows["structured"][1]["mean_difference"] == pytest.approx(0.0 - BEST_OF_2)
    assert [r["examples"] for r in choice.confirm_rows] == [4, 4]
    for row in choice.confirm_rows:
        assert row["mean_difference"] == pytest.approx(3.5 - BEST_OF_2) and row["higher"] == 4
    assert choice.meets_target


def test_the_choice_never_sees_the_confirmation_half():
    choice_ids, confirm_ids = split_questions(IDS, seed=3)
    # evolution is strong only where it is chosen, structured_evolution only where it is confirmed.
    lucky = {**dict.fromkeys(choice_ids, 3.5), **dict.fromkeys(confirm_ids, 1.0)}
    late = {**dict.fromkeys(choice_ids, 2.5), **dict.fromkeys(confirm_ids, 9.0)}
    records = folder_records({"evolution": lucky, "structured_evolution": late})
    choice = choose_strongest([records], REFERENCE, [1.5], split_seed=3)
    assert (choice.choice_ids, choice.confirm_ids) == (choice_ids, confirm_ids)
    assert choice.attack == "evolution" and not choice.meets_target
    assert choice.confirm_rows[0]["mean_difference"] == pytest.approx(1.0 - BEST_OF_2)
    assert choice.confirm_rows[0]["higher"] == 0


def test_higher_on_too_few_questions_misses_the_target():
    _, confirm_ids = split_questions(IDS, seed=0)
    # Far higher on one confirmation question, a little lower on the other three: 1/4 < 60%.
    mixed = {**everywhere(3.5), **dict.fromkeys(confirm_ids[1:], 2.0), confirm_ids[0]: 20.0}
    choice = choose_strongest([folder_records({"evolution": mixed})], REFERENCE, [1.5])
    assert choice.attack == "evolution" and choice.confirm_rows[0]["higher"] == 1
    assert choice.confirm_rows[0]["mean_difference"] > 0 and not choice.meets_target


def test_refusals():
    records = folder_records({"evolution": everywhere(3.5)})
    with pytest.raises(ValueError, match="one per set"):
        choose_strongest([records, records], REFERENCE, [1.5])
    few = [r for r in records if r["id"] in IDS[:3]]
    with pytest.raises(ValueError, match="recorded on 3 questions"):
        choose_strongest([few], REFERENCE, [1.5])
    unsearched = folder_records({"row_reverse": everywhere(9.0)})
    with pytest.raises(ValueError, match="no searching attack"):
        choose_strongest([unsearched], REFERENCE, [1.5])


def test_report_section(tmp_path):
    folders = []
    for name, structured in [("small", 9.0), ("large", 0.0)]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"model": name, "dataset": "wtq", "seed": 0, "attacks": {}}))
        for r in folder_records({"evolution": everywhere(3.5), "structured": everywhere(structured)}):
            append_record(folder / "results.jsonl", {"clean_loss": 0.0, "scores": {}, "seconds": 1.0, **r})
        folders.append(str(folder))
    args = ["--results", ",".join(folders), "--choose_strongest", "--sampled_reference", REFERENCE]
    done = run_binary("report", [*args, "--backward_cost", "1.5,1.0"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "The strongest attack against best-of-j" in done.stdout and "| **evolution** |" in done.stdout
    assert "Target (higher on ≥ 60%" in done.stdout and ": met." in done.stdout
    done = run_binary("report", [*args, "--backward_cost", "1.5,1.0,2.0"])
    assert done.returncode != 0 and "3 values for 2 --results folders" in done.stderr
    done = run_binary("report", ["--results", ",".join(folders), "--choose_strongest"])
    assert done.returncode != 0 and "give --sampled_reference" in done.stderr


def test_the_strongest_preset_is_the_attack_the_study_chose():
    """``strongest`` must stay what the recorded study chooses: both victims' folders, best-of-64 as the
    reference, each model's measured backward cost (fwd+bwd over fwd − 1 in its CPU benchmark)."""
    study = REPO / "docs" / "results" / "stronger_attacks"
    models = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
    costs = []
    for model in models:
        bench = json.loads((REPO / "docs" / "benchmarks" / f"{model}_cpu2.json").read_text())
        costs.append(bench["fwd_bwd_median_s"] / bench["fwd_median_s"] - 1)
    choice = choose_strongest([load_run(study / m).records for m in models], "best_of_k@k=64", costs)
    assert preset("strongest") == preset(choice.attack), choice.attack
