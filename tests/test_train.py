"""Adversarial training on a tiny random decoder with the real SmolLM2 tokenizer: LoRA's transform, the step,
the trainer's batches, orders, log, skips, checkpoints and resume, the HF export, and data parallelism on forced
CPU devices.

The runs share their shapes (batches of 2 examples whose prompts fall in one text bucket), so the step and the
attack compile once for the whole file.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from atp_jax.attack.presets import preset
from atp_jax.attack.run import attack
from atp_jax.inference.qa import prompt_ids, token_nll
from atp_jax.models.loading import load_model
from atp_jax.tables.prompt import encode_text, reference_answer
from atp_jax.tables.table import Example, Table
from atp_jax.train import trainer
from atp_jax.train.lora import LoraConfig, init_lora, merge
from atp_jax.train.step import (
    TrainStepConfig,
    init_optimizer,
    init_params,
    learning_rate,
    settings,
    train_step,
    trained_model,
)
from atp_jax.train.trainer import TrainConfig, batch_indices, export, make_batch, train

REPO = Path(__file__).resolve().parents[1]

EXAMPLES = [
    Example(
        "Which team plays in Rome?",
        Table(
            ["Team", "City", "Wins"],
            [["Lions", "Paris", "3"], ["Bears", "Rome", "12"], ["Owls", "Oslo", "7"], ["Foxes", "Lima", "1"]],
        ),
        ["Bears"],
        "rome",
        dataset="wtq",
    ),
    Example(
        "Which city has the most wins?",
        Table(
            ["Club", "Town", "Wins"],
            [["Hawks", "Bern", "5"], ["Wolves", "Kyiv", "2"], ["Bees", "Nice", "9"], ["Crows", "Riga", "4"]],
        ),
        ["Nice"],
        "wins",
        dataset="wtq",
    ),
    Example(
        "How many goals did Ada score?",
        Table(["Player", "Goals", "Team"], [["Ada", "7", "Reds"], ["Bo", "3", "Blues"], ["Cy", "5", "Greens"]]),
        ["7"],
        "goals",
        dataset="wtq",
    ),
]
ADVERSARIAL = "best_of_k@k=2"  # the orders depend on the weights: a resumed run must attack the same weights


def _config(**overrides) -> TrainConfig:
    settings = {"attack": ADVERSARIAL, "steps": 4, "batch_size": 2, "learning_rate": 1e-3, "checkpoint_every": 2}
    return TrainConfig(**{**settings, **overrides})


def _log(folder: Path) -> list[dict]:
    """The training log without its timings (the only fields two equal runs may differ in)."""
    lines = (folder / trainer.LOG).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if "seconds" not in k} for line in lines]


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama()


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """The same 4-step adversarial run three ways: straight through; killed during step 4 (after step 3 was
    logged, with the last checkpoint at step 2) and resumed; and run for 2 steps, then extended to 4. The straight
    run records the batches its steps were given."""
    base = tmp_path_factory.mktemp("runs")
    out = {"dirs": {name: base / name for name in ("straight", "killed", "extended")}, "batches": []}

    real_step = trainer.train_step
    with pytest.MonkeyPatch.context() as patch:

        def recording(model, params, opt_state, batch, config):
            out["batches"].append(jax.tree.map(np.asarray, batch))
            return real_step(model, params, opt_state, batch, config)

        patch.setattr(trainer, "train_step", recording)
        out["straight"] = train(tiny, EXAMPLES, _config(), out["dirs"]["straight"], progress=False)

    with pytest.MonkeyPatch.context() as patch:
        calls = []

        def dying(*args):
            calls.append(1)
            if len(calls) == 4:
                raise KeyboardInterrupt  # a kill in step 4, after step 3's log line and step 2's checkpoint
            return real_step(*args)

        patch.setattr(trainer, "train_step", dying)
        with pytest.raises(KeyboardInterrupt):
            train(tiny, EXAMPLES, _config(), out["dirs"]["killed"], progress=False)
    out["killed_log"] = _log(out["dirs"]["killed"])
    out["resumed"] = train(tiny, EXAMPLES, _config(), out["dirs"]["killed"], progress=False)

    out["first_half"] = train(tiny, EXAMPLES, _config(steps=2), out["dirs"]["extended"], progress=False)
    out["extended"] = train(tiny, EXAMPLES, _config(), out["dirs"]["extended"], progress=False)
    return out


# ----------------------------------------------------------------------------------------------------- LoRA


def test_lora_with_zero_b_is_the_base_model_and_merges_w_plus_scaled_ab(tiny):
    model = tiny.model
    config = LoraConfig(rank=4, alpha=8.0)
    lora = init_lora(model.layers.weights(), config, jax.random.key(1))
    assert set(lora) == set(config.targets)
    assert lora["q_proj"]["a"].shape == (2, 64, 4) and lora["down_proj"]["b"].shape == (2, 4, 64)
    assert float(jnp.std(lora["gate_proj"]["a"])) == pytest.approx(1 / 8, rel=0.1)  # N(0, 1/in), in = 64
    ids = np.asarray([encode_text(tiny.tokenizer, "Which team plays in Rome? The Bears")], np.int32)
    positions = np.arange(ids.shape[1] - 1)[None]
    targets = ids[:, 1:]
    base = np.asarray(token_nll(model, ids, positions, targets))
    step_config = TrainStepConfig(lora=config)
    zero = np.asarray(token_nll(trained_model(model, lora, step_config), ids, positions, targets))
    assert np.array_equal(zero, base)

    moved = jax.tree.map(lambda x: x + 0.1, lora)  # B no longer zero
    merged = merge(model.layers.weights(), moved, config)
    by_hand = model.layers.q_proj[...] + 2.0 * jnp.einsum("lir,lro->lio", moved["q_proj"]["a"], moved["q_proj"]["b"])
    np.testing.assert_allclose(merged["q_proj"], by_hand, atol=1e-6)
    assert np.array_equal(merged["attn_norm"], model.layers.attn_norm[...])  # not a target: passed through
    other = np.asarray(token_nll(trained_model(model, moved, step_config), ids, positions, targets))
    assert np.abs(other - base).max() > 1e-3


def test_lora_configs_refuse_what_they_cannot_train():
    with pytest.raises(ValueError, match="rank=0; it must be >= 1"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="distinct kernel names from q_proj"):
        LoraConfig(targets=("q_proj", "attn_norm"))


@pytest.fixture(scope="module")
def lora_step(tiny):
    """Two LoRA steps on a batch of two examples: the adapters before and after, the model's weights around it."""
    config = TrainStepConfig(learning_rate=1e-2, lora=LoraConfig(rank=4))
    rows = [(prompt_ids(tiny, e), encode_text(tiny.tokenizer, reference_answer(e))) for e in EXAMPLES[:2]]
    batch = make_batch(rows, 2)
    before_model = _leaves(nnx.state(tiny.model))
    params = init_params(tiny.model, config, jax.random.key(0))
    start = jax.tree.map(np.asarray, params)
    state = init_optimizer(params, config)
    losses = []
    for _ in range(2):
        params, state, loss, norm = train_step(tiny.model, params, state, batch, config)
        losses.append((float(loss), float(norm)))
    return {"config": config, "start": start, "params": params, "losses": losses, "before_model": before_model}


def test_a_lora_step_changes_only_the_adapters(tiny, lora_step):
    params, start = lora_step["params"], lora_step["start"]
    assert jax.tree.structure(params) == jax.tree.structure(start)  # the adapters, nothing else
    for name, adapter in params.items():
        assert not np.array_equal(adapter["b"], start[name]["b"]), name  # every B moved off zero
        assert not np.array_equal(adapter["a"], start[name]["a"]), name  # and A once B was nonzero
    after_model = _leaves(nnx.state(tiny.model))
    assert all(np.array_equal(a, b) for a, b in zip(after_model, lora_step["before_model"]))
    (first, norm), (second, _) = lora_step["losses"]
    assert np.isfinite(norm) and norm > 0 and second < first


def test_the_learning_rate_warms_up_then_holds_or_decays():
    def rates(**kw):
        values = settings(TrainStepConfig(learning_rate=1.0, warmup_steps=4, total_steps=12, **kw))
        return [float(learning_rate(values, k)) for k in range(13)]

    constant, cosine = rates(), rates(schedule="cosine")
    assert constant[:5] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0]) and constant[-1] == 1.0
    assert cosine[:4] == constant[:4] and cosine[4] == pytest.approx(1.0)
    assert cosine[8] == pytest.approx(0.5) and cosine[12] == pytest.approx(0.0, abs=1e-7)
    assert all(a >= b for a, b in zip(cosine[3:], cosine[4:]))


# ---------------------------------------------------------------------------------------------- the trainer


def test_batches_are_a_function_of_seed_and_step_and_cover_each_epoch():
    steps = [batch_indices(3, 2, seed=5, step=k) for k in range(1, 7)]
    assert steps == [batch_indices(3, 2, seed=5, step=k) for k in range(1, 7)]
    flat = sum(steps, [])
    for epoch in range(4):
        assert sorted(flat[3 * epoch : 3 * epoch + 3]) == [0, 1, 2]  # every example once an epoch
    assert steps != [batch_indices(3, 2, seed=6, step=k) for k in range(1, 7)]


def test_a_clean_fine_tune_lowers_the_loss_and_runs_no_attack(tiny, tmp_path, monkeypatch):
    def no_attack(*args, **kwargs):
        raise AssertionError("vanilla must not run the inner attack")

    monkeypatch.setattr(trainer, "attack", no_attack)
    config = _config(attack="vanilla", steps=10, learning_rate=3e-3, checkpoint_every=10)
    result = train(tiny, EXAMPLES[:2], config, tmp_path, progress=False)
    assert len(result.losses) == 10
    assert result.losses[-1] < result.losses[0] - 1.0, result.losses
    for record in _log(tmp_path):
        assert sorted(record["examples"]) == ["rome", "wins"]  # batch 2 of 2 examples: both, every step
        for order in record["orders"]:
            assert order["row_perm"] == [0, 1, 2, 3] and order["col_perm"] == [0, 1, 2]
            assert order["attack_loss"] is None and order["attack_seed"] is None
    assert ocp.CheckpointManager(tmp_path / "checkpoints").all_steps() == [10]


def test_a_killed_and_resumed_run_ends_as_one_never_interrupted(runs):
    straight = runs["straight"]
    assert [r["step"] for r in runs["killed_log"]] == [1, 2, 3]  # killed in step 4, checkpoint at 2
    for name, folder in (("resumed", "killed"), ("extended", "extended")):
        result = runs[name]
        assert result.resumed_from == 2, name
        assert result.losses == straight.losses, name
        assert _log(runs["dirs"][folder]) == _log(runs["dirs"]["straight"]), name  # step 3 not logged twice
        for a, b in zip(_leaves(result.params), _leaves(straight.params)):
            assert np.array_equal(a, b), name
    assert runs["first_half"].losses == straight.losses[:2]


def test_the_orders_trained_on_are_the_inner_attacks_on_that_steps_weights(tiny, runs):
    log = _log(runs["dirs"]["straight"])
    # Step 1 attacks the starting weights; step 3 the weights after step 2, those the 2-step run ended with.
    for step, model in ((1, tiny), (3, runs["first_half"].model)):
        for order in log[step - 1]["orders"]:
            example = next(e for e in EXAMPLES if e.id == order["id"])
            again = attack(model, example, preset(ADVERSARIAL, seed=order["attack_seed"]))
            assert (list(again.row_perm), list(again.col_perm)) == (order["row_perm"], order["col_perm"])
            assert again.loss == pytest.approx(order["attack_loss"], abs=1e-5)
    orders = [order for record in log for order in record["orders"]]
    assert any(order["row_perm"] != sorted(order["row_perm"]) for order in orders)  # the attack moved rows
    # Each step was given the prompts of the logged orders, re-rendered and tokenized, then the answer.
    assert len(runs["batches"]) == 4
    for record, batch in zip(log, runs["batches"]):
        for row, order in enumerate(record["orders"]):
            example = next(e for e in EXAMPLES if e.id == order["id"])
            prompt = prompt_ids(tiny, example, example.table.permute(order["row_perm"], order["col_perm"]))
            target = encode_text(tiny.tokenizer, reference_answer(example))
            assert batch.ids[row, : len(prompt) + len(target)].tolist() == prompt + target
            assert batch.targets[row, : len(target)].tolist() == target
            assert batch.target_mask[row].sum() == len(target)


def test_a_resume_with_other_settings_is_refused(tiny, runs):
    with pytest.raises(ValueError, match=r"holds another training run \(learning_rate 0.001 -> 0.01\)"):
        train(tiny, EXAMPLES, _config(learning_rate=1e-2), runs["dirs"]["straight"], progress=False)
    with pytest.raises(ValueError, match="holds step 4, past steps=3"):
        train(tiny, EXAMPLES, _config(steps=3), runs["dirs"]["straight"], progress=False)


def test_a_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tiny, tmp_path):
    # A step of 1e30 per weight: finite after step 1, the logits overflow in step 2.
    config = _config(attack="vanilla", steps=4, learning_rate=1e30, checkpoint_every=1)
    with pytest.raises(FloatingPointError, match=r"step 2: the training loss is .*the last good checkpoint, step 1"):
        train(tiny, EXAMPLES[:2], config, tmp_path, progress=False)
    assert ocp.CheckpointManager(tmp_path / "checkpoints").all_steps() == [1]
    assert [record["step"] for record in _log(tmp_path)] == [1]


def test_unusable_examples_are_counted_skips(tiny, tmp_path):
    lengths = {e.id: len(prompt_ids(tiny, e)) for e in EXAMPLES}
    long_table = Table(["Name", "Score"], [[f"player {k}", str(k)] for k in range(30)])
    unusable = [
        Example("Who won?", EXAMPLES[0].table, [], "no_answer", dataset="wtq"),
        Example("Who won?", Table(["Name", "Score"], [["Ada", "3"]]), ["Ada"], "one_row", dataset="wtq"),
        Example("Who scored 29?", long_table, ["player 29"], "long", dataset="wtq"),
    ]
    # A context the usable prompts (and their answers) fit in and the long table's does not.
    assert len(prompt_ids(tiny, unusable[2])) > max(lengths.values()) + 40
    short = dataclasses.replace(
        tiny, config=dataclasses.replace(tiny.config, max_position_embeddings=max(lengths.values()) + 20)
    )
    config = _config(attack=ADVERSARIAL + ",mode=row", steps=1)
    result = train(short, [*EXAMPLES, *unusable], config, tmp_path, progress=False)
    expected = {"no_reference_answer": 1, "too_long": 1, "too_small": 1}
    assert result.skipped == expected and result.usable == 3
    written = json.loads((tmp_path / trainer.SKIPPED).read_text())
    assert written["counts"] == expected
    assert {k: v["reason"] for k, v in written["examples"].items()} == {
        "no_answer": "no_reference_answer",
        "one_row": "too_small",
        "long": "too_long",
    }
    assert "has one data row" in written["examples"]["one_row"]["message"]
    assert set(_log(tmp_path)[0]["examples"]) <= {e.id for e in EXAMPLES}
    # A clean fine-tune has no order to attack: a one-row table is usable there.
    usable, skipped = trainer.usable_examples(short, unusable, _config(attack="vanilla"))
    assert [e.id for e in usable] == ["one_row"] and set(skipped) == {"no_answer", "long"}
    with pytest.raises(ValueError, match="none of the 3 examples can be trained on"):
        train(short, unusable, config, tmp_path / "none", progress=False)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="unknown attack 'nonsense'"):
        TrainConfig(attack="nonsense")
    with pytest.raises(ValueError, match="steps=0; it must be >= 1"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="lora_rank=-1"):
        TrainConfig(lora_rank=-1)
    with pytest.raises(ValueError, match="schedule='linear'"):
        TrainConfig(schedule="linear")
    with pytest.raises(ValueError, match="example ids must be unique"):
        trainer.usable_examples(None, [EXAMPLES[0], EXAMPLES[0]], TrainConfig())


# ------------------------------------------------------------------------------------------------- export


def _logits(model, ids):
    return np.asarray(_logits_jit(model, jnp.asarray(ids)))


@jax.jit
def _logits_jit(model, ids):
    B, S = ids.shape
    return model(model.embed(ids), jnp.broadcast_to(jnp.arange(S), (B, S)), jnp.ones((B, S), bool)).logits


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_an_exported_model_loads_back_with_the_same_logits(tiny, lora_step, runs, tmp_path, kind):
    if kind == "lora":
        params, config = lora_step["params"], TrainConfig(lora_rank=4)
        trained = trained_model(tiny.model, params, lora_step["config"])
    else:
        params, config, trained = runs["straight"].params, TrainConfig(), runs["straight"].model.model
    folder = export(tiny, params, config, tmp_path / "model")
    again = load_model(folder)
    assert again.config == tiny.config
    ids = np.asarray([encode_text(tiny.tokenizer, "Which team plays in Rome? The Bears")], np.int32)
    assert encode_text(again.tokenizer, "Which team plays in Rome?") == encode_text(
        tiny.tokenizer, "Which team plays in Rome?"
    )
    expected = _logits(trained, ids)
    assert np.abs(_logits(again.model, ids) - expected).max() < 1e-5
    assert np.abs(_logits(tiny.model, ids) - expected).max() > 1e-4  # training changed the model


# --------------------------------------------------------------------------------------------- data parallel


@pytest.mark.forced_devices
def test_data_parallel_training_equals_one_device(smollm2_tokenizer, tmp_path):
    smollm2_tokenizer.save_pretrained(tmp_path / "tokenizer")
    env = {
        **os.environ,
        # Unoptimised XLA code compiles in a third of the time; both sides of every comparison run under it.
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0",
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "forced_devices.py"),
            "train",
            str(tmp_path / "tokenizer"),
            "data=2;data=4",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["devices"] == 4
    single = result["steps"]["none"]
    assert single["max_update"] > 5e-4  # the step moved the parameters (by about the learning rate, 1e-3)
    for mesh in ("data=2", "data=4"):
        got = result["steps"][mesh]
        assert got["loss"] == pytest.approx(single["loss"], rel=1e-6), mesh
        assert got["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-5), mesh
        assert got["max_grad_difference"] < 1e-5 * single["max_grad"], mesh
        # Adam divides each gradient entry by its own magnitude, so an entry near zero turns float rounding into
        # a visible share of a step; the bound is a tenth of a step (a wrong gradient moves most entries by a
        # whole one).
        assert got["max_param_difference"] < 1e-4, mesh
    runs = result["train"]
    assert set(runs) == {"none", "data=2", "data=2,model=2"} and len(runs["none"]["losses"]) == 3
    for mesh, run in runs.items():
        assert run["losses"] == pytest.approx(runs["none"]["losses"], rel=1e-6), mesh
        assert run["max_param_difference"] < 3e-4, mesh  # 3 steps of 1e-3 (see above)
        assert run["programs"] == 1, mesh  # one compiled step for all 3 steps: the state keeps its placement
