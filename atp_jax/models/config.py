"""Architecture hyper-parameters of the decoder, read from an HF ``config.json`` dict.

One frozen dataclass covers the Llama family (Llama 2/3/3.1, SmolLM2) and Qwen2/Qwen2.5: they differ
only in q/k/v biases, a tied or separate output head and the RoPE frequency schedule.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")


class ConfigError(ValueError):
    """A model config that atp-jax cannot build a decoder from."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1's ``rope_type: llama3`` frequency schedule (long wavelengths divided by ``factor``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                    f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                    f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], source: str = "config") -> ModelConfig:
        """Builds the config from an HF ``config.json`` dict; ``source`` names it in error messages."""

        def need(key):
            if key not in hf or hf[key] is None:
                raise ConfigError(f"{source}: missing required key {key!r}")
            return hf[key]

        model_type = need("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                    f"{source}: unsupported architecture model_type={model_type!r}; "
                    f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        head_dim = hf.get("head_dim") or hidden // heads
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        return cls(
                architecture=model_type,
                vocab_size=int(need("vocab_size")),
                hidden_size=hidden,
                intermediate_size=int(need("intermediate_size")),
                num_layers=int(need("num_hidden_layers")),
                num_heads=heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rope_theta=float(hf.get("rope_theta") or _rope_parameters(hf).get("rope_theta") or 10000.0),
                rope_scaling=_parse_rope_scaling(hf, source),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                # Qwen2 always has q/k/v biases; Llama has them only when ``attention_bias`` says so.
                attention_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
        )


def _rope_parameters(hf: Mapping[str, Any]) -> Mapping[str, Any]:
    # transformers 5 writes ``rope_parameters`` (incl. rope_theta); 4.x writes ``rope_scaling``.
    return hf.get("rope_parameters") or hf.get("rope_scaling") or {}


def _parse_rope_scaling(hf: Mapping[str, Any], source: str) -> RopeScaling | None:
    params = _rope_parameters(hf)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in (None, "default"):
        return None
    if rope_type != "llama3":
        raise ConfigError(f"{source}: unsupported rope scaling type {rope_type!r}; supported: default, llama3")
    return RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def rope_inverse_frequencies(config: ModelConfig):
    """The RoPE inverse frequencies [head_dim // 2] as float32 numpy, with llama3 scaling applied."""
    import numpy as np

    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    inv_freq = inv_freq.astype(np.float32)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)
