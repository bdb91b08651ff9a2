"""Known architectures as HF ``config.json`` dicts, for speed and memory measurements without weights.

``load_model("config:<name>")`` builds one of these with random weights, so a benchmark can size up a
Llama-3.1-8B step on a machine that holds no checkpoint. The values are those of the public
``config.json`` files of the base models (the instruct variants share the architecture). Only the shapes
matter for speed: random weights and a stand-in tokenizer change no timing. ``tiny-llama`` is no published
model: a test-sized decoder over SmolLM2's vocabulary.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from atp_jax.models.config import ModelConfig
from atp_jax.models.schema import schema_for

CONFIG_PREFIX = "config:"


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "rope_scaling": _llama3_rope(8.0),
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "llama-3.2-1b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rope_theta": 500000.0,
        "rope_scaling": _llama3_rope(32.0),
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    "qwen2.5-3b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    "smollm2-135m": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    # Test-sized (not a published model): SmolLM2's vocabulary, 4 query heads over 2 KV heads, so meshes with
    # model=2 or 4 split the heads and, at 4, must replicate the KV heads.
    "tiny-llama": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
}

# The zoo model whose tokenizer stands in for each family's (its ids are all the benchmarks need).
FAMILY_TOKENIZER = {"llama": "smollm2-135m-instruct", "qwen2": "qwen2.5-coder-0.5b-instruct"}


def list_architectures() -> list[str]:
    """Names accepted by :func:`hf_config` and by ``load_model("config:<name>")``, sorted."""
    return sorted(_ARCHITECTURES)


def hf_config(name: str) -> dict[str, Any]:
    """A copy of the named architecture's HF config dict; ``ValueError`` listing the names if unknown."""
    if name not in _ARCHITECTURES:
        raise ValueError(f"unknown architecture config {name!r}; known: {', '.join(list_architectures())}")
    return copy.deepcopy(_ARCHITECTURES[name])


def model_config(name: str) -> ModelConfig:
    return ModelConfig.from_hf(hf_config(name), source=f"{CONFIG_PREFIX}{name}")


def parameter_counts(config: ModelConfig) -> dict[str, int]:
    """Parameters by part: token embeddings, all decoder layers, output head (0 when tied), final norm.

    Counted from the architecture's weight schema. ``total`` counts a tied head once, as the published
    model sizes do.
    """
    counts = {"embedding": 0, "layers": 0, "head": 0, "final_norm": 0}
    for spec in schema_for(config.architecture).tensors_for(config):
        part = "layers" if spec.per_layer else _COUNTED_AS.get(spec.field, spec.field)
        counts[part] = counts.get(part, 0) + math.prod(spec.model_shape(config))
    counts["total"] = sum(counts.values())
    return counts


# The part each global tensor of the schema is counted under (others under their field name).
_COUNTED_AS = {"embed_tokens": "embedding", "lm_head": "head"}
