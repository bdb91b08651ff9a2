"""Architecture hyper-parameters of the decoder, read from and written to an HF ``config.json`` dict.

One frozen dataclass covers the Llama family (Llama 2/3/3.1, SmolLM2) and Qwen2/Qwen2.5: they differ
only in q/k/v biases, a tied or separate output head and the RoPE frequency schedule. The tensors each
architecture has are declared in ``atp_jax.models.schema``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from atp_jax.models.schema import SUPPORTED_ARCHITECTURES, schema_for


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

    @property
    def q_dim(self) -> int:
        """Width of all query heads together."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together."""
        return self.num_kv_heads * self.head_dim

    @property
    def untied_head(self) -> bool:
        """The output head is a matrix of its own (not the token embeddings)."""
        return not self.tie_word_embeddings

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
            attention_bias=bool(hf.get("attention_bias", schema_for(model_type).attention_bias_default)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
        )

    def to_hf(self) -> dict[str, Any]:
        """The HF ``config.json`` dict of this config: ``ModelConfig.from_hf(config.to_hf()) == config``.

        Written in the keys ``from_hf`` reads (``rope_theta`` and a ``rope_scaling`` dict, as transformers
        4.x writes them; transformers 5 accepts them too), every optional field spelled out.
        """
        eos = self.eos_token_ids
        return {
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rope_scaling": (
                None if self.rope_scaling is None else {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
            ),
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": self.attention_bias,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": None if not eos else (eos[0] if len(eos) == 1 else list(eos)),
        }


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
