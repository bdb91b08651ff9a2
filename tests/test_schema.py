"""Each architecture's weight schema against independent references: transformers' models (HF names,
shapes, parameter counts) and gguf-py's own tensor-name map (GGUF names)."""

import gguf
import numpy as np
import pytest

from atp_jax.models import architectures, params, schema
from atp_jax.models.config import ModelConfig
from atp_jax.models.params import random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Tiny configs covering the optional tensors of every architecture: a tied head or not; Qwen2's q/k/v biases.
# (transformers' Llama with attention_bias also biases o_proj, which the decoder does not have.)
TINY = {
    "vocab_size": 50,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e4,
}
CONFIGS = {
    f"{arch}-{'tied' if tied else 'untied'}": ModelConfig.from_hf(
        {"model_type": arch, **TINY, "tie_word_embeddings": tied, "attention_bias": bias}
    )
    for arch in schema.SUPPORTED_ARCHITECTURES
    for tied in (True, False)
    for bias in (arch == "qwen2",)
}


def _transformers_model(config: ModelConfig):
    hf_config = transformers.AutoConfig.for_model(**config.to_hf())
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()


def _schema_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for spec in schema.schema_for(config.architecture).tensors_for(config):
        for layer in range(config.num_layers) if spec.per_layer else (None,):
            shapes[spec.hf_name_of(layer)] = spec.hf_shape(config)
    return shapes


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    config = CONFIGS[request.param]
    return config, _transformers_model(config)


def test_hf_names_and_shapes_are_those_of_the_transformers_model(pair):
    config, model = pair
    # named_parameters lists a tied head once, as the embedding; the schema has no lm_head then either.
    reference = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert _schema_shapes(config) == reference


def test_parameter_counts_are_those_of_the_transformers_model(pair):
    config, model = pair
    counts = architectures.parameter_counts(config)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["head"] == (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


def test_export_hf_gives_back_the_weights_that_were_loaded(pair):
    config, model = pair
    state = {name: p.detach().numpy() for name, p in model.named_parameters()}
    loaded = params.build_model(config, state.items())
    exported = params.export_hf(loaded)
    assert exported.keys() == state.keys()
    for name, array in exported.items():
        np.testing.assert_array_equal(array, state[name], err_msg=name)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_model_parameters_have_the_schema_shapes(name):
    config = CONFIGS[name]
    exported = params.export_hf(random_model(config))
    assert {n: a.shape for n, a in exported.items()} == _schema_shapes(config)


@pytest.mark.parametrize("arch", schema.SUPPORTED_ARCHITECTURES)
def test_gguf_names_are_those_of_gguf_py(arch):
    gguf_arch = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}.get(arch)
    if gguf_arch is None:
        pytest.skip(f"llama.cpp writes no architecture named {arch!r}")
    name_map = gguf.get_tensor_name_map(gguf_arch, 3)
    for spec in schema.SCHEMAS[arch].tensors:
        for layer in (0, 2) if spec.per_layer else (None,):
            hf_name = spec.hf_name_of(layer)
            assert name_map.get_name(hf_name, try_suffixes=(".weight", ".bias")) == spec.gguf_name_of(layer), hf_name


def test_names_map_back_to_their_spec_and_layer():
    llama = schema.SCHEMAS["llama"]
    spec, layer = llama.find_hf("model.layers.11.self_attn.k_proj.bias")
    assert (spec.field, layer, spec.rotary) == ("layers.k_bias", 11, True)
    spec, layer = llama.find_gguf("output.weight")
    assert (spec.field, layer, spec.transpose) == ("lm_head", None, True)
    assert llama.find_hf("model.layers.0.self_attn.rotary.weight") is None
    assert llama.is_ignored("model.layers.0.self_attn.rotary_emb.inv_freq")


def test_unsupported_architecture_lists_the_supported_ones():
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'; supported: llama, qwen2"):
        schema.schema_for("gpt2")


def test_row_blocks_in_any_split_build_the_same_model(pair):
    config, model = pair
    state = {name: p.detach().numpy() for name, p in model.named_parameters()}
    whole = params.export_hf(params.build_model(config, state.items()))
    blocks = [
        params.RowBlock(name, start, array[start : start + 3])
        for name, array in reversed(state.items())
        for start in range(0, len(array), 3)
    ]
    pieced = params.export_hf(params.build_model_from_blocks(config, blocks))
    for name, array in whole.items():
        np.testing.assert_array_equal(pieced[name], array, err_msg=name)
    with pytest.raises(params.WeightsError, match="arrived more than once"):
        params.build_model_from_blocks(config, blocks + blocks[:1])
    with pytest.raises(params.WeightsError, match=r"missing tensors for .*\[1\]"):
        params.build_model_from_blocks(config, [b for b in blocks if not b.name.startswith("model.layers.1.")])
