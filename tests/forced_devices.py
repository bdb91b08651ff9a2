"""The multi-device half of ``test_sharding.py``, run as its own process on forced CPU devices.

JAX fixes its device count when it first starts a backend, so a test that needs 8 devices runs this
script in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (see
``run_on_devices`` in ``test_sharding.py``). Each check computes on one device (JAX's default device, no
mesh) and on every mesh asked for, and prints what the test compares as one JSON object; the asserts live
in the test.

    python tests/forced_devices.py attacks "model=4;data=4;data=2,model=2"
    python tests/forced_devices.py load CHECKPOINT_DIR "model=4;data=2,model=2"
    python tests/forced_devices.py train TOKENIZER_DIR "data=2;data=4"
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import atp_jax
from atp_jax.inference.generate import greedy_decode
from atp_jax.models import params
from atp_jax.models.config import ModelConfig
from atp_jax.models.params import RowBlock
from atp_jax.sharding import device_bytes, make_mesh

# Each attack at a small budget: enough steps for the trajectories to depend on every earlier step.
ATTACKS = (
    "atp_st@n_attack=3,restarts=4",
    "paper@n_attack=3,restarts=4",  # the same compiled program as atp_st: other values, one compile
    "search@n_attack=2,candidates=4",
    "best_of_k@k=8",
    "evolution@generations=2,population=4",
)


def _fields(model) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model)))[0]
    return {".".join(str(k.key) for k in path): np.asarray(value) for path, value in flat}


def attacks(meshes: list[str]) -> dict:
    """Every attack of ``ATTACKS`` on one sample table, on one device and on each mesh: the chosen orders, the
    loss and clean loss, and the ATP trace's per-step losses; and greedy continuations of two prompts."""
    example = atp_jax.Example(
        "Which city has the most rain?",
        atp_jax.Table(
            ["City", "Rain (mm)", "Country"],
            [
                ["Bergen", "2250", "Norway"],
                ["Lima", "16", "Peru"],
                ["Cork", "1200", "Ireland"],
                ["Cairo", "25", "Egypt"],
            ],
        ),
        ["Bergen"],
        "rain",
    )
    out = {"devices": jax.device_count(), "table": [example.table.n_rows, example.table.n_cols], "runs": {}}
    for mesh in ["none", *meshes]:
        model = atp_jax.load_model("config:tiny-llama", mesh=None if mesh == "none" else mesh)
        runs = {}
        for name in ATTACKS:
            result = atp_jax.attack(model, example, atp_jax.preset(name))
            runs[name] = {
                "row_perm": list(result.row_perm),
                "col_perm": list(result.col_perm),
                "loss": result.loss,
                "clean_loss": result.clean_loss,
                "queries": result.queries,
                "trace_loss": np.asarray(result.trace.get("loss", [])).ravel().tolist(),
            }
        out["runs"][mesh] = runs
        # Greedy decoding with its KV cache, no stop token (a random model may stop at once), two left-padded
        # prompts of different lengths.
        prompts = [model.tokenizer(text).input_ids for text in ("Which city has the most rain?", "Bergen 2250")]
        ids, mask = np.zeros((2, 16), np.int32), np.zeros((2, 16), bool)
        for row, prompt in enumerate(prompts):
            ids[row, 16 - len(prompt) :], mask[row, 16 - len(prompt) :] = prompt, True
        tokens = greedy_decode(model.model, ids, mask, np.asarray([-1], np.int32), 0, 8)
        out.setdefault("answers", {})[mesh] = np.asarray(tokens).tolist()
    return out


def _odd_blocks(blocks, rows: int = 3):
    """Every tensor again in blocks of ``rows`` rows, so blocks straddle the shards' edges."""
    for name, start, array in blocks:
        for offset in range(0, len(array), rows):
            yield RowBlock(name, start + offset, array[offset : offset + rows])


def load(checkpoint: str, meshes: list[str]) -> dict:
    """An HF checkpoint loaded on one device and on each mesh (float32 whole and in 3-row blocks, bfloat16 in
    blocks on the first mesh): whether every weight is equal to the one-device load, the bytes each device holds
    against the whole model's, and the largest logit difference on random ids."""
    from pathlib import Path

    folder = Path(checkpoint)
    config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 7)))

    def logits(model):
        return np.asarray(model(model.embed(ids), jnp.arange(7)[None].repeat(2, 0), jnp.ones((2, 7), bool)).logits)

    out = {"devices": jax.device_count(), "meshes": {}}
    for dtype in ("float32", "bfloat16"):
        single = params.build_model(config, params.iter_safetensors(folder), jnp.dtype(dtype))
        reference, reference_logits = _fields(single), logits(single)
        total = sum(a.nbytes for a in reference.values())
        # bfloat16 on the first mesh only: the dtype changes the cast on the host, not where a block goes.
        for mesh_spec in meshes if dtype == "float32" else meshes[:1]:
            mesh = make_mesh(mesh_spec)
            for way in ("whole", "3-row blocks") if dtype == "float32" else ("3-row blocks",):
                tensors = params.iter_safetensors(folder)
                if way == "whole":
                    model = params.build_model(config, tensors, jnp.dtype(dtype), mesh=mesh)
                else:
                    blocks = _odd_blocks(RowBlock(name, 0, array) for name, array in tensors)
                    model = params.build_model_from_blocks(config, blocks, jnp.dtype(dtype), mesh=mesh)
                fields = _fields(model)
                held = device_bytes(nnx.state(model))
                shardings = {
                    name: list(leaf.sharding.spec)
                    for name, leaf in zip(fields, jax.tree.leaves(nnx.to_pure_dict(nnx.state(model))))
                }
                out["meshes"][f"{dtype} {mesh_spec} {way}"] = {
                    "equal": sorted(name for name in reference if np.array_equal(reference[name], fields[name])),
                    "fields": sorted(reference),
                    "total_bytes": total,
                    "device_bytes": sorted(held.values()),
                    "mesh_devices": len(held),
                    "shardings": shardings,
                    "max_logit_difference": float(np.abs(logits(model) - reference_logits).max()),
                }
    # Seeded random weights: the same on every mesh.
    single = _fields(params.random_model(config, seed=1))
    out["random_equal"] = {
        mesh_spec: all(
            np.array_equal(single[name], array)
            for name, array in _fields(params.random_model(config, seed=1, mesh=make_mesh(mesh_spec))).items()
        )
        for mesh_spec in meshes
    }
    return out


def _step_batch(vocab: int):
    """A fixed training batch of 3 rows padded to 4 (``example_mask``): right-padded ids, answers of 3 and 2
    tokens in 4 slots."""
    from atp_jax.train.step import Batch

    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (4, 24)).astype(np.int32)
    positions = np.array([[9, 10, 11, 0], [15, 16, 0, 0], [19, 20, 21, 0], [0, 0, 0, 0]], np.int32)
    targets = np.take_along_axis(ids, positions + 1, axis=1)
    target_mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], np.float32)
    return Batch(ids, positions, targets, target_mask, np.array([1, 1, 1, 0], np.float32))


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def _largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def train(tokenizer_dir: str, meshes: list[str]) -> dict:
    """Training on one device and on each mesh. A full fine-tune's batch-loss gradient (its largest difference
    from the one-device gradient, and that gradient's largest entry) and one ``train_step`` (loss, gradient norm,
    the largest parameter difference and the largest update). Then a 3-step LoRA ``train`` run (3 examples a
    batch, which a 2-way data axis pads to 4) on one device, on the first mesh (the model loaded without it:
    ``train`` places it) and on ``data=2,model=2`` (the model loaded tensor-parallel): per-step losses, the
    adapters' largest difference from the one-device run's and how many step programs it compiled."""
    from transformers import AutoTokenizer

    from atp_jax.train.step import (
        TrainStepConfig,
        _train_step,
        batch_loss,
        init_optimizer,
        init_params,
        place,
        train_step,
    )
    from atp_jax.train.trainer import TrainConfig
    from atp_jax.train.trainer import train as train_run

    config = ModelConfig(
        architecture="llama",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    batch = _step_batch(config.vocab_size)
    out = {"devices": jax.device_count(), "steps": {}, "train": {}}
    step_config = TrainStepConfig(learning_rate=1e-3)
    reference = None
    for mesh_spec in ["none", *meshes]:
        mesh = None if mesh_spec == "none" else make_mesh(mesh_spec)
        model = params.random_model(config, seed=0, mesh=mesh)
        trainable = init_params(model, step_config, jax.random.key(0))
        start = _leaves(trainable)
        placed = place(batch, mesh)
        grads = _leaves(jax.jit(jax.grad(batch_loss), static_argnums=3)(trainable, model, placed, step_config))
        state = init_optimizer(trainable, step_config)
        trainable, state, loss, norm = train_step(model, trainable, state, placed, step_config)
        new = _leaves(trainable)
        reference = reference or {"grads": grads, "params": new}
        out["steps"][mesh_spec] = {
            "loss": float(loss),
            "grad_norm": float(norm),
            "max_grad": max(float(np.abs(g).max()) for g in grads),
            "max_grad_difference": _largest_difference(grads, reference["grads"]),
            "max_param_difference": _largest_difference(new, reference["params"]),
            "max_update": _largest_difference(new, start),
        }
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tiny = dataclasses.replace(config, vocab_size=len(tokenizer))
    table = atp_jax.Table(["City", "Rain"], [["Bergen", "2250"], ["Lima", "16"], ["Cork", "1200"]])
    questions = [("Which city is wettest?", "Bergen"), ("Which city is driest?", "Lima"), ("Rain in Cork?", "1200")]
    examples = [atp_jax.Example(q, table, [a], f"q{k}", dataset="wtq") for k, (q, a) in enumerate(questions)]
    run = TrainConfig(attack="vanilla", steps=3, batch_size=3, learning_rate=1e-3, lora_rank=2)
    trained = None
    # One device; the first mesh, the model loaded without it (train places it); 2 x 2 devices, the model loaded
    # tensor-parallel on them.
    for mesh_spec, placed in (("none", False), (meshes[0], False), ("data=2,model=2", True)):
        mesh = None if mesh_spec == "none" else make_mesh(mesh_spec)
        weights = params.random_model(tiny, seed=0, mesh=mesh if placed else None)
        loaded = atp_jax.LoadedModel("tiny", tiny, weights, tokenizer, "random", 0.0)
        programs = _train_step._cache_size()
        with tempfile.TemporaryDirectory() as folder:
            result = train_run(loaded, examples, run, folder, mesh=mesh, progress=False)
        adapters = _leaves(result.params)
        trained = trained or adapters
        out["train"][mesh_spec] = {
            "losses": list(result.losses),
            "max_param_difference": _largest_difference(adapters, trained),
            "programs": _train_step._cache_size() - programs,
        }
    return out


if __name__ == "__main__":
    check, *args = sys.argv[1:]
    if check == "attacks":
        result = attacks(args[0].split(";"))
    elif check == "load":
        result = load(args[0], args[1].split(";"))
    elif check == "train":
        result = train(args[0], args[1].split(";"))
    else:
        raise SystemExit(f"unknown check {check!r}: attacks, load or train")
    print("RESULT " + json.dumps(result))
