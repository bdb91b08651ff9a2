"""Many examples at once: attacking the examples of a shape bucket together changes no result.

The reference is each example attacked alone (``attack``) with the same seed: every registered attack must
choose the same orders, at the same cost, with the same losses (1e-5, float32) when its examples are attacked
as one batch (``attack_many``), and the binary must write the same records with ``--batch_examples``.
"""

import json

import numpy as np
import pytest
from conftest import LARGE, SMALL, SMALL_TWIN, distinct_presets, run_binary

from atp_jax.attack.batched import ComputePool, attack_many
from atp_jax.attack.presets import preset
from atp_jax.attack.problem import make_problem
from atp_jax.attack.run import attack
from atp_jax.runs.experiment import run_group, run_one
from atp_jax.runs.records import SkipRecord
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example, Table


def _example(question, header, rows, answer, id_):
    return Example(question, Table(header, rows), [answer], id_)


# Three tables of one bucket of the default grid (different cells, questions, answers and real sizes) ...
SAME_BUCKET = [
    SMALL,
    SMALL_TWIN,
    _example(
        "Who scored 40 points?",
        ["Name", "Team", "Points"],
        [
            ["Ada", "Lions", "12"],
            ["Ben", "Bears", "40"],
            ["Cy", "Owls", "7"],
            ["Dee", "Foxes", "19"],
            ["Eve", "Crows", "3"],
        ],
        "Ben",
        "points",
    ),
]
# ... one of another bucket, and one a row attack cannot take (a single data row).
OTHER_BUCKET = LARGE
ONE_ROW = _example("What is the capital?", ["Country", "Capital"], [["Peru", "Lima"]], "Lima", "one_row")


@pytest.fixture(scope="module")
def problems(sharp):
    cache = {}

    def get(example, objective):
        if (example.id, objective) not in cache:
            cache[example.id, objective] = make_problem(sharp, example, objective=objective)
        return cache[example.id, objective]

    return get


def _assert_same(together, alone, where):
    assert (together.row_perm, together.col_perm) == (alone.row_perm, alone.col_perm), where
    assert (together.queries, together.backward_calls) == (alone.queries, alone.backward_calls), where
    np.testing.assert_allclose(
        [together.loss, together.clean_loss], [alone.loss, alone.clean_loss], rtol=1e-6, atol=1e-5, err_msg=where
    )


@pytest.mark.parametrize("name", distinct_presets())
def test_every_attack_on_a_batch_of_examples_equals_each_alone(sharp, problems, name):
    config = preset(name, seed=5)
    batch = [problems(example, config.objective) for example in SAME_BUCKET]
    assert len({p.sizes for p in batch}) == 1 and len({p.layout.sizes for p in batch}) == 3  # one bucket, 3 shapes
    together = attack_many(sharp, batch, config, name)
    for example, problem, result in zip(SAME_BUCKET, batch, together):
        alone = attack(sharp, example, config, problem=problem, name=name)
        _assert_same(result, alone, f"{name}, {example.id}")
        assert result.method == name and result.trace["batch_examples"] == 3
        trace = {k: v for k, v in result.trace.items() if k != "batch_examples"}
        assert trace.keys() == alone.trace.keys()
        for key, value in alone.trace.items():  # losses per step, entropies, generations' best ...
            if isinstance(value, list) and value and not isinstance(value[0], (dict, str)):
                np.testing.assert_allclose(trace[key], value, rtol=1e-4, atol=1e-5, err_msg=f"{name}.{key}")
            elif isinstance(value, int):
                assert trace[key] == value, f"{name}.{key}"


def test_a_batch_runs_as_few_rounds_as_one_example(sharp, problems):
    """Best-of-20 with candidate batches of 8 is 3 batched forwards, for 3 examples as for one."""
    batch = [problems(example, "ce") for example in SAME_BUCKET]
    config = preset("best_of_k", seed=0)
    pool_rounds = []
    original = ComputePool._run_round

    def counting(self):
        pool_rounds.append(len(self._requests))
        original(self)

    ComputePool._run_round = counting
    try:
        attack_many(sharp, batch, config)
    finally:
        ComputePool._run_round = original
    assert pool_rounds == [3, 3, 3]  # every round carries all three examples


def test_examples_of_different_buckets_cannot_share_a_pool(sharp, problems):
    with pytest.raises(ValueError, match="one shape bucket"):
        ComputePool(sharp, [problems(SAME_BUCKET[0], "ce"), problems(OTHER_BUCKET, "ce")])


def test_an_error_in_one_example_reaches_the_caller_and_frees_the_others(sharp, problems):
    batch = [problems(example, "ce") for example in SAME_BUCKET]
    from atp_jax.attack import registry

    method = registry.method("best_of_k")
    calls = []

    def failing(evaluator, config, rng):
        calls.append(evaluator.index)
        if evaluator.index == 1:
            raise RuntimeError("example 1 broke")
        return method.run(evaluator, config, rng)

    original = registry._METHODS["best_of_k"]
    registry._METHODS["best_of_k"] = registry.Method(original.config, failing)
    try:
        with pytest.raises(RuntimeError, match="example 1 broke"):
            attack_many(sharp, batch, preset("best_of_k"))
    finally:
        registry._METHODS["best_of_k"] = original
    assert sorted(calls) == [0, 1, 2]


@pytest.mark.parametrize("config_name", ["atp_row", "evolution"])
def test_run_group_gives_each_example_the_record_it_gets_alone(sharp, config_name):
    """Two buckets and an example the attack skips, with generation: the same records, in order."""
    examples = [SAME_BUCKET[0], OTHER_BUCKET, ONE_ROW, SAME_BUCKET[1], SAME_BUCKET[2]]
    config = preset(config_name, seed=2)
    grouped = run_group(sharp, examples, config_name, config, PromptStyle(), max_new_tokens=8)
    for example, record in zip(examples, grouped):
        alone = run_one(sharp, example, config_name, config, PromptStyle(), max_new_tokens=8)
        assert type(record) is type(alone) and record.id == example.id == alone.id
        if isinstance(alone, SkipRecord):
            assert record.skipped == alone.skipped
            continue
        assert (record.row_perm, record.col_perm, record.queries) == (alone.row_perm, alone.col_perm, alone.queries)
        np.testing.assert_allclose(record.answer_loss, alone.answer_loss, rtol=1e-6, atol=1e-5)
        assert record.prediction == alone.prediction and record.scores == alone.scores


def test_run_attack_batch_examples_writes_the_same_records(tiny_checkpoint, tmp_path):
    """--batch_examples is a throughput choice, not a configuration: the records match, and a folder resumes
    across the flag."""
    args = ["--model", tiny_checkpoint, "--num_examples", "4", "--nocompilation_cache", "--max_new_tokens", "8"]
    args += ["--attacks", "vanilla,best_of_k@k=3,atp_st,search_warm", "--n_attack", "2", "--restarts", "2"]
    records = {}
    for folder, batch in (("together", "3"), ("alone", "1")):
        done = run_binary("run_attack", [*args, "--batch_examples", batch, "--output_dir", tmp_path / folder])
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in (tmp_path / folder / "results.jsonl").read_text().splitlines()]
        records[folder] = {(r["id"], r["attack"]): r for r in lines}
    assert records["together"].keys() == records["alone"].keys() and len(records["alone"]) == 16
    batched = 0
    for key, alone in records["alone"].items():
        together = records["together"][key]
        assert (together["row_perm"], together["col_perm"]) == (alone["row_perm"], alone["col_perm"]), key
        assert together["prediction"] == alone["prediction"] and together["queries"] == alone["queries"], key
        assert together["answer_loss"] == pytest.approx(alone["answer_loss"], rel=1e-6, abs=1e-5), key
        batched += together["trace"].get("batch_examples", 1) > 1
    assert batched > 0  # some examples did share a bucket
    again = run_binary("run_attack", [*args, "--batch_examples", "1", "--output_dir", tmp_path / "together"])
    assert again.returncode == 0 and "16 recorded, 0 to run" in again.stdout, again.stderr[-2000:]


def test_batch_examples_must_be_positive(tiny_checkpoint, tmp_path):
    done = run_binary(
        "run_attack", ["--model", tiny_checkpoint, "--batch_examples", "0", "--output_dir", tmp_path / "x"]
    )
    assert done.returncode != 0 and "--batch_examples" in done.stderr
