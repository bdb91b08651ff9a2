"""The device mesh: ``--mesh`` parsing, where each weight lives, and — on 8 forced CPU devices — that a mesh
changes neither the weights nor what an attack finds.

The multi-device checks run ``tests/forced_devices.py`` in a subprocess (JAX fixes its device count when
it starts) and compare what it prints: every mesh against one device, in float32 within 1e-5.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from atp_jax.models import architectures, params
from atp_jax.models.params import random_model
from atp_jax.models.partitioning import partition_spec
from atp_jax.models.schema import schema_for
from atp_jax.sharding import MeshError, make_mesh, mesh_shape, parse_mesh

REPO = Path(__file__).resolve().parents[1]
MESHES = ("model=4", "data=4", "data=2,model=2")


def run_on_devices(count: int, *args: str, timeout: float = 900) -> dict:
    """``tests/forced_devices.py ARGS`` on ``count`` forced CPU devices; its JSON result."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}",
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "forced_devices.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


# ----------------------------------------------------------------------------------------- --mesh


@pytest.mark.parametrize(
    "text, sizes",
    [
        (None, {}),
        ("", {}),
        ("model=8", {"model": 8}),
        ("data=2,model=4", {"data": 2, "model": 4}),
        (" model = 2 , data=1 ", {"model": 2, "data": 1}),
    ],
)
def test_parse_mesh(text, sizes):
    assert parse_mesh(text) == sizes


@pytest.mark.parametrize(
    "text, message",
    [
        ("pipeline=2", r"'pipeline=2' is not AXIS=SIZE with AXIS one of data, model"),
        ("model", r"'model' is not AXIS=SIZE"),
        ("model=0", r"the size of 'model' must be a positive integer, got '0'"),
        ("model=two", r"got 'two'"),
        ("model=2,model=4", r"axis 'model' given twice"),
    ],
)
def test_bad_mesh_values_are_named(text, message):
    with pytest.raises(MeshError, match=message):
        parse_mesh(text)


@pytest.mark.parametrize(
    "sizes, devices, shape",
    [
        ({}, 8, (8, 1)),  # the default: every device on data
        ({"model": 8}, 8, (1, 8)),
        ({"model": 4}, 8, (2, 4)),  # data takes what is left
        ({"data": 4}, 8, (4, 1)),  # explicit sizes may leave devices unused
        ({"data": 2, "model": 2}, 8, (2, 2)),
        ({}, 1, (1, 1)),
    ],
)
def test_mesh_shape(sizes, devices, shape):
    assert mesh_shape(sizes, devices) == shape


def test_mesh_shape_refuses_what_the_devices_cannot_hold():
    with pytest.raises(MeshError, match=r"needs 16 devices; this process has 8"):
        mesh_shape({"data": 4, "model": 4}, 8)
    with pytest.raises(MeshError, match=r"8 devices do not split into groups of 3"):
        mesh_shape({"model": 3}, 8)


def test_one_device_is_no_mesh():
    assert make_mesh(None, devices=jax.local_devices()[:1]) is None


# ----------------------------------------------------------------------------------------- partitioning


def _specs(name: str, model_size: int) -> dict[str, P]:
    config = architectures.model_config(name)
    return {s.field: partition_spec(s, config, model_size) for s in schema_for(config.architecture).tensors_for(config)}


def test_tensor_parallel_layout_of_llama_8b_on_8_devices():
    # 32 heads, 8 KV heads, 14336 MLP units, 128256 tokens: every unit count divides by 8. Kernels are
    # stored (in, out) under a leading layer axis.
    specs = _specs("llama-3.1-8b", 8)
    column, row = P(None, None, "model"), P(None, "model", None)
    assert {f: specs[f] for f in ("layers.q_proj", "layers.k_proj", "layers.v_proj")} == dict.fromkeys(
        ("layers.q_proj", "layers.k_proj", "layers.v_proj"), column
    )
    assert specs["layers.gate_proj"] == specs["layers.up_proj"] == column
    assert specs["layers.o_proj"] == specs["layers.down_proj"] == row
    assert specs["embed_tokens"] == P("model", None) and specs["lm_head"] == P(None, "model")
    assert specs["layers.attn_norm"] == specs["layers.mlp_norm"] == P(None, None)
    assert specs["final_norm"] == P(None)


def test_fewer_kv_heads_than_devices_split_the_hidden_size_instead():
    # Qwen2.5-7B has 4 KV heads: on 8 devices k/v split along the hidden size (each device computes a partial
    # product of all KV heads, summed across devices), their biases stay whole; q keeps its 28 heads... which
    # do not divide by 8 either, so q too splits along the hidden size. On 4 devices heads split.
    on8, on4 = _specs("qwen2.5-7b", 8), _specs("qwen2.5-7b", 4)
    assert on8["layers.k_proj"] == on8["layers.v_proj"] == P(None, "model", None)
    assert on8["layers.k_bias"] == on8["layers.v_bias"] == P(None, None)
    assert on8["layers.q_proj"] == P(None, "model", None) and on8["layers.q_bias"] == P(None, None)
    assert on8["layers.o_proj"] == P(None, None, "model")  # its input (28 heads) cannot split: its output does
    assert on4["layers.q_proj"] == on4["layers.k_proj"] == P(None, None, "model")
    assert on4["layers.k_bias"] == P(None, "model") and on4["layers.o_proj"] == P(None, "model", None)


def test_one_device_replicates_everything():
    assert set(_specs("tiny-llama", 1).values()) <= {P(None), P(None, None), P(None, None, None)}


def test_random_weights_are_seeded_blocks_of_the_schema_tensors():
    config = architectures.model_config("tiny-llama")
    weights = params.export_hf(random_model(config, seed=3))
    again = params.export_hf(random_model(config, seed=3))
    other = params.export_hf(random_model(config, seed=4))
    assert all(np.array_equal(weights[name], again[name]) for name in weights)
    embed = weights["model.embed_tokens.weight"]
    assert embed.shape == (49152, 64) and abs(embed.std() - 0.02) < 1e-3 and abs(embed.mean()) < 1e-3
    assert not np.array_equal(embed, other["model.embed_tokens.weight"])
    assert np.array_equal(weights["model.norm.weight"], np.ones(64, np.float32))
    # Blocks of different tensors and layers are different draws.
    q0, q1 = weights["model.layers.0.self_attn.q_proj.weight"], weights["model.layers.1.self_attn.q_proj.weight"]
    assert not np.array_equal(q0, q1) and not np.array_equal(q0[:64], embed[:64, :64])


# ----------------------------------------------------------------------------------------- 8 forced devices


@pytest.fixture(scope="module")
def attack_runs():
    return run_on_devices(8, "attacks", ";".join(MESHES))


@pytest.mark.forced_devices
@pytest.mark.parametrize("mesh", MESHES)
def test_attacks_find_the_same_orders_and_losses_on_every_mesh(attack_runs, mesh):
    assert attack_runs["devices"] == 8
    single, sharded = attack_runs["runs"]["none"], attack_runs["runs"][mesh]
    for name, expected in single.items():
        got = sharded[name]
        assert (got["row_perm"], got["col_perm"]) == (expected["row_perm"], expected["col_perm"]), name
        assert got["queries"] == expected["queries"], name
        for key in ("loss", "clean_loss"):
            assert got[key] == pytest.approx(expected[key], abs=1e-5), (name, key)
        assert got["trace_loss"] == pytest.approx(expected["trace_loss"], abs=1e-5), name


@pytest.mark.forced_devices
def test_greedy_decoding_is_the_same_on_every_mesh(attack_runs):
    answers = attack_runs["answers"]
    assert set(answers) == {"none", *MESHES} and len(answers["none"]) == 2 and len(answers["none"][0]) == 8
    assert all(tokens == answers["none"] for tokens in answers.values()), answers


@pytest.mark.forced_devices
def test_the_attacks_ran_something_to_compare(attack_runs):
    runs = attack_runs["runs"]["none"]
    assert len(runs["atp_st@n_attack=3,restarts=4"]["trace_loss"]) == 12  # 4 restarts x 3 steps
    # The attacks moved: not every one returned the original order.
    assert any(run["row_perm"] != sorted(run["row_perm"]) for run in runs.values())


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    """A random Qwen2 with biases and an untied head, saved by transformers: 4 heads over 2 KV heads, a 97-token
    vocabulary (which divides by no mesh here, so the embeddings split along the hidden size)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    transformers.Qwen2ForCausalLM(config).float().save_pretrained(path, safe_serialization=True)
    return path


@pytest.mark.forced_devices
def test_weights_load_straight_into_their_shards(tiny_qwen2):
    meshes = ("model=4", "data=2,model=2", "model=8")
    result = run_on_devices(8, "load", str(tiny_qwen2), ";".join(meshes))
    assert len(result["meshes"]) == 2 * len(meshes) + 1
    for key, run in result["meshes"].items():
        assert run["equal"] == run["fields"], key  # every weight exactly the one-device load's
        assert run["max_logit_difference"] < (1e-5 if key.startswith("float32") else 2e-2), key
        model = 8 if " model=8 " in key else 4 if " model=4 " in key else 2
        # Each device holds its shards: a 1/model share of the weights plus the replicated norms and biases,
        # never the whole model.
        assert max(run["device_bytes"]) < run["total_bytes"] / model * 1.1, key
    assert result["random_equal"] == dict.fromkeys(meshes, True)
    shardings = result["meshes"]["float32 model=4 whole"]["shardings"]
    assert shardings["layers.q_proj"] == [None, None, "model"]
    assert shardings["layers.k_proj"] == [None, "model", None]  # 2 KV heads on 4 devices
    assert shardings["embed_tokens"] == [None, "model"]  # 97 tokens do not split
