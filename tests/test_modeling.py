"""The Flax decoder against transformers' PyTorch Llama/Qwen2 on tiny random checkpoints."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from atp_jax.models import params
from atp_jax.models.config import ConfigError, ModelConfig
from atp_jax.models.loading import load_model
from atp_jax.models.modeling import KVCache, default_positions

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = dict(
    rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32
)


def _llama(rope_scaling=None):
    cfg = transformers.LlamaConfig(**TINY, rope_theta=10000.0, tie_word_embeddings=False)
    if rope_scaling:
        cfg.rope_parameters = {"rope_theta": 10000.0, **rope_scaling}
    return transformers.LlamaForCausalLM(cfg)


def _qwen2(tied):
    cfg = transformers.Qwen2Config(**TINY, rope_theta=1e6, tie_word_embeddings=tied)
    return transformers.Qwen2ForCausalLM(cfg)


CASES = {
    "llama": lambda: _llama(),
    "llama3-rope": lambda: _llama(LLAMA3_ROPE),
    "qwen2-tied": lambda: _qwen2(True),
    "qwen2-untied": lambda: _qwen2(False),
}


def _save(torch_model, path):
    torch.manual_seed(0)
    with torch.no_grad():  # random biases too, so a missing bias cannot pass unnoticed
        for name, p in torch_model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    torch_model.save_pretrained(path, safe_serialization=True)
    return json.loads((path / "config.json").read_text())


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    torch.manual_seed(0)
    torch_model = CASES[request.param]().float().eval()
    path = tmp_path_factory.mktemp(request.param)
    hf_config = _save(torch_model, path)
    config = ModelConfig.from_hf(hf_config)
    model = params.build_model(config, params.iter_safetensors(path))
    return request.param, torch_model, model, config


def _torch_logits(torch_model, ids, mask, positions):
    with torch.no_grad():
        out = torch_model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(positions),
        )
    return out.logits.numpy()


def test_config_round_trip(pair):
    name, torch_model, _, config = pair
    assert config.num_layers == 3 and config.num_kv_heads == 2 and config.head_dim == 16
    assert config.attention_bias == name.startswith("qwen2")
    assert (config.rope_scaling is not None) == (name == "llama3-rope")


@pytest.mark.parametrize("layout", ["plain", "left-padded", "shifted"])
def test_logits_match_transformers(pair, layout):
    _, torch_model, model, _ = pair
    rng = np.random.default_rng(1)
    B, S = 2, 11
    ids = rng.integers(0, TINY["vocab_size"], (B, S))
    mask = np.ones((B, S), np.int64)
    if layout == "left-padded":
        mask[0, :4] = 0
    positions = np.asarray(default_positions(jnp.asarray(mask)))
    if layout == "shifted":
        positions = positions + np.array([[5], [17]])
    expected = _torch_logits(torch_model, ids, mask, positions)
    out = model(model.embed(jnp.asarray(ids)), jnp.asarray(positions), jnp.asarray(mask))
    real = mask.astype(bool)  # padded query rows are undefined in both implementations
    np.testing.assert_allclose(np.asarray(out.logits)[real], expected[real], atol=1e-4, rtol=1e-4)


def test_full_mask_and_selected_logits_agree_with_padding_mask(pair):
    _, _, model, _ = pair
    ids = jnp.asarray(np.random.default_rng(2).integers(0, TINY["vocab_size"], (1, 9)))
    embeds = model.embed(ids)
    pos = jnp.arange(9)[None]
    ref = model(embeds, pos, jnp.ones((1, 9), bool)).logits
    full = jnp.tril(jnp.ones((1, 9, 9), bool))
    out = model(embeds, pos, full, logits_positions=jnp.array([[3, 8]]))
    np.testing.assert_allclose(out.logits, ref[:, jnp.array([3, 8])], atol=1e-5)


def test_attentions_are_probabilities(pair):
    _, _, model, config = pair
    ids = jnp.arange(7)[None]
    out = model(model.embed(ids), jnp.arange(7)[None], jnp.ones((1, 7), bool), return_attentions=True)
    assert out.attentions.shape == (config.num_layers, 1, config.num_heads, 7, 7)
    np.testing.assert_allclose(out.attentions.sum(-1), 1.0, atol=1e-5)
    assert float(jnp.abs(jnp.triu(out.attentions, 1)).max()) == 0.0  # causal


def test_cache_prefill_then_continue_equals_one_pass(pair):
    _, _, model, config = pair
    ids = jnp.asarray(np.random.default_rng(3).integers(0, TINY["vocab_size"], (1, 10)))
    pos = jnp.arange(10)[None]
    ref = model(model.embed(ids), pos, jnp.ones((1, 10), bool)).logits
    T = 12
    cache = KVCache.zeros(config, 1, T, model.dtype)
    causal = jnp.tril(jnp.ones((10, T), bool))  # query i may see slots 0..i
    first = model(model.embed(ids[:, :6]), pos[:, :6], causal[None, :6], cache=cache, cache_index=0)
    second = model(model.embed(ids[:, 6:]), pos[:, 6:], causal[None, 6:], cache=first.cache, cache_index=6)
    np.testing.assert_allclose(second.logits, ref[:, 6:], atol=1e-5)


def test_gradient_to_embeddings_is_finite(pair):
    _, _, model, _ = pair
    ids = jnp.arange(8)[None]
    embeds = model.embed(ids)

    def loss(e):
        return model(e, jnp.arange(8)[None], jnp.ones((1, 8), bool)).logits[0, -1, 0]

    g = jax.grad(loss)(embeds)
    assert g.shape == embeds.shape and bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).sum()) > 0


def _embedding_gradient(model, ids, positions):
    def loss(e):
        logits = model(e, positions, jnp.ones(ids.shape, bool)).logits
        return jax.nn.log_softmax(logits[0, -4:]).sum()

    return jax.jit(jax.grad(loss)), model.embed(ids)


def test_remat_keeps_gradients_and_frees_the_activations(pair):
    _, torch_model, model, _ = pair
    ids, positions = jnp.arange(48)[None] % 97, jnp.arange(48)[None] + 3
    embeds = torch.tensor(np.asarray(model.embed(ids)), requires_grad=True)
    out = torch_model(inputs_embeds=embeds, position_ids=torch.tensor(np.asarray(positions)))
    torch.log_softmax(out.logits[0, -4:], dim=-1).sum().backward()
    kept, remat = nnx.clone(model), nnx.clone(model)
    remat.remat = True
    for m in (kept, remat):
        grad, e = _embedding_gradient(m, ids, positions)
        np.testing.assert_allclose(grad(e)[0], embeds.grad.numpy()[0], atol=2e-5, rtol=2e-4)
    # The backward of the recomputing model holds less: its compiled program's scratch memory is smaller.
    scratch = {}
    for name, m in (("kept", kept), ("remat", remat)):
        compiled = _embedding_gradient(m, ids, positions)[0].lower(m.embed(ids)).compile()
        scratch[name] = compiled.memory_analysis().temp_size_in_bytes
    assert scratch["remat"] < scratch["kept"], scratch


def test_load_model_passes_remat_to_the_model(tiny_checkpoint):
    assert load_model(tiny_checkpoint).model.remat is False
    assert load_model(tiny_checkpoint, remat=True).model.remat is True


def test_bfloat16_parameters_track_float32(pair, tmp_path):
    name, torch_model, model32, config = pair
    path = tmp_path / "ckpt"
    torch_model.save_pretrained(path, safe_serialization=True)
    model16 = params.build_model(config, params.iter_safetensors(path), dtype=jnp.bfloat16)
    assert model16.layers.q_proj[...].dtype == jnp.bfloat16
    ids = jnp.arange(8)[None]
    args = (jnp.arange(8)[None], jnp.ones((1, 8), bool))
    a = model32(model32.embed(ids), *args).logits
    b = model16(model16.embed(ids), *args).logits
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(a, b, atol=0.1)


def test_missing_and_unexpected_tensors_are_named(pair, tmp_path):
    _, _, _, config = pair
    with pytest.raises(params.WeightsError, match="missing tensors"):
        params.build_model(config, iter([]))
    with pytest.raises(params.WeightsError, match="model.layers.0.self_attn.rotary.weight"):
        params.build_model(config, iter([("model.layers.0.self_attn.rotary.weight", np.zeros(3))]))
    with pytest.raises(params.WeightsError, match="has shape"):
        params.build_model(config, iter([("model.norm.weight", np.zeros(3, np.float32))]))


def test_config_errors_name_the_problem():
    base = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    with pytest.raises(ConfigError, match="unsupported architecture.*gpt2"):
        ModelConfig.from_hf({**base, "model_type": "gpt2"})
    with pytest.raises(ConfigError, match="missing required key 'vocab_size'"):
        ModelConfig.from_hf({k: v for k, v in base.items() if k != "vocab_size"})
    with pytest.raises(ConfigError, match="rope scaling type 'yarn'"):
        ModelConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})


def test_load_model_rejects_unknown_specs(tmp_path):

    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*smollm2-135m-instruct"):
        load_model("no-such-model")
    with pytest.raises(ValueError, match="needs config.json"):
        load_model(tmp_path)


def test_sharded_checkpoint_with_index_loads_like_a_single_file(pair, tmp_path):
    _, torch_model, model, config = pair
    torch_model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    sharded = params.build_model(config, params.iter_safetensors(tmp_path))
    ids = jnp.arange(6)[None]
    args = (jnp.arange(6)[None], jnp.ones((1, 6), bool))
    np.testing.assert_array_equal(sharded(sharded.embed(ids), *args).logits, model(model.embed(ids), *args).logits)
    (tmp_path / sorted(p.name for p in tmp_path.glob("*.safetensors"))[0]).unlink()
    with pytest.raises(params.WeightsError, match="lists shards that are not in the directory"):
        list(params.iter_safetensors(tmp_path))
