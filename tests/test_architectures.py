"""The named architectures behind ``load_model("config:<name>")``: parsed configs and parameter counts."""

import jax
import numpy as np
import pytest
from flax import nnx

import atp_jax
from atp_jax.models import architectures, gguf, zoo
from atp_jax.models.config import ModelConfig
from atp_jax.models.modeling import Transformer

# Sizes published on the model cards.
PUBLISHED_PARAMETERS = {
    "llama-3.1-8b": 8.03e9,
    "llama-3.2-1b": 1.24e9,
    "qwen2.5-7b": 7.61e9,
    "qwen2.5-3b": 3.09e9,
    "qwen2.5-0.5b": 0.49e9,
    "smollm2-135m": 135e6,
}


TEST_SIZED = ("tiny-llama",)  # no published model: decoders for tests and dry runs


def test_every_architecture_has_a_published_size():
    assert architectures.list_architectures() == sorted([*PUBLISHED_PARAMETERS, *TEST_SIZED])


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_parameter_count_matches_the_published_size(name):
    config = ModelConfig.from_hf(architectures.hf_config(name), source=name)
    total = architectures.parameter_counts(config)["total"]
    assert total == pytest.approx(PUBLISHED_PARAMETERS[name], rel=0.02)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_parameter_count_matches_the_model_it_builds(name):
    # Shapes only (eval_shape allocates nothing), so even the 8B model costs nothing to check.
    config = architectures.model_config(name)
    state = nnx.state(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    built = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(state))
    assert built == architectures.parameter_counts(config)["total"]


def test_parsed_fields():
    llama = architectures.model_config("llama-3.1-8b")
    assert (llama.num_layers, llama.hidden_size, llama.num_kv_heads, llama.head_dim) == (32, 4096, 8, 128)
    assert llama.rope_scaling.factor == 8.0 and not llama.tie_word_embeddings
    small = architectures.model_config("llama-3.2-1b")
    assert small.rope_scaling.factor == 32.0 and small.tie_word_embeddings and small.head_dim == 64
    qwen = architectures.model_config("qwen2.5-7b")
    assert qwen.attention_bias and qwen.rope_scaling is None and qwen.rope_theta == 1e6
    assert architectures.model_config("smollm2-135m").rope_theta == 1e5


def test_hf_config_returns_a_copy():
    architectures.hf_config("llama-3.2-1b")["rope_scaling"]["factor"] = 1.0
    assert architectures.hf_config("llama-3.2-1b")["rope_scaling"]["factor"] == 32.0


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown architecture config 'llama-9'.*llama-3\.1-8b.*smollm2-135m"):
        atp_jax.load_model("config:llama-9")


@pytest.mark.parametrize(
    ("name", "zoo_name"), [("smollm2-135m", "smollm2-135m-instruct"), ("qwen2.5-0.5b", "qwen2.5-coder-0.5b-instruct")]
)
def test_shapes_agree_with_the_zoo_checkpoint_of_the_same_architecture(name, zoo_name):
    try:
        real = ModelConfig.from_hf(gguf.read_gguf_config(zoo.resolve(zoo_name)))
    except zoo.ZooError as e:
        pytest.skip(f"zoo model unavailable: {e}")
    table = architectures.model_config(name)
    fields = (
        "architecture",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "rope_theta",
        "rms_norm_eps",
        "attention_bias",
    )
    assert {f: getattr(table, f) for f in fields} == {f: getattr(real, f) for f in fields}


def test_load_random_weights_model():
    loaded = atp_jax.load_model("config:smollm2-135m")
    assert loaded.name == "config:smollm2-135m" and "random weights" in loaded.source
    assert loaded.config == architectures.model_config("smollm2-135m")
    if loaded.tokenizer is not None:  # the family's zoo tokenizer, when the zoo can provide it
        ids = loaded.tokenizer.encode("Which row comes first?")
        assert max(ids) < loaded.config.vocab_size
    again = atp_jax.load_model("config:smollm2-135m")
    np.testing.assert_array_equal(loaded.model.layers.q_proj[...][0, :4, :4], again.model.layers.q_proj[...][0, :4, :4])


def test_tokenizer_directory_replaces_the_zoo_lookup(tmp_path, monkeypatch, smollm2_tokenizer):
    """Offline, a config: model takes a saved HF tokenizer and never asks the zoo."""
    smollm2_tokenizer.save_pretrained(tmp_path)

    def no_zoo(name):
        raise AssertionError(f"the zoo was asked for {name}")

    monkeypatch.setattr(zoo, "resolve", no_zoo)
    loaded = atp_jax.load_model("config:smollm2-135m", tokenizer=tmp_path)
    text = "Which row comes first?"
    assert loaded.tokenizer.encode(text) == smollm2_tokenizer.encode(text)
    assert str(tmp_path) in loaded.source


def test_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(50_000)}  # SmolLM2's architecture has 49152 ids
    big = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    big.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="50000 tokens do not fit config:smollm2-135m's vocabulary of 49152"):
        atp_jax.load_model("config:smollm2-135m", tokenizer=tmp_path)


@pytest.mark.parametrize("name", architectures.list_architectures())
def test_to_hf_inverts_from_hf_for_every_architecture(name):
    config = architectures.model_config(name)
    assert ModelConfig.from_hf(config.to_hf()) == config


@pytest.mark.parametrize("name", architectures.list_architectures())
def test_transformers_reads_to_hf_as_meant(name):
    # transformers rewrites the dict its own way (rope_parameters, defaults); reading its result back must
    # give the same config, so a torch model built from to_hf() is the architecture we mean.
    transformers = pytest.importorskip("transformers")
    config = architectures.model_config(name)
    assert ModelConfig.from_hf(transformers.AutoConfig.for_model(**config.to_hf()).to_dict()) == config


def _zoo_marks(name: str) -> list:
    """Parsing a Qwen vocabulary takes seconds (see test_gguf), so those are slow; the 1.5B is a 1.1 GB download."""
    if "1.5b" in name:
        return [pytest.mark.large]
    return [pytest.mark.slow] if name.startswith("qwen") else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=_zoo_marks(n)) for n in zoo.list_models()])
def test_to_hf_inverts_from_hf_for_every_zoo_model(name):
    try:
        path = zoo.resolve(name)
    except zoo.ZooError as e:
        pytest.skip(f"zoo model unavailable: {e}")
    config = ModelConfig.from_hf(gguf.read_gguf_config(path))
    assert ModelConfig.from_hf(config.to_hf()) == config
