"""One declarative weight schema per architecture: every tensor's names, place in the model and shape.

A ``TensorSpec`` describes one weight tensor: its Hugging Face name, its llama.cpp (GGUF) name, the model
field it fills, its HF ``(out, in)`` shape in terms of ``ModelConfig`` attributes, whether the model stores
it transposed (kernels are ``(in, out)``), when it is present (biases, an untied head) and whether its rows
are rotary (q/k), which llama.cpp reorders for some architectures. Names holding ``{layer}`` repeat per layer;
the model stacks those on a leading ``[L]`` axis.

Everything that depends on the tensor set is derived from these tables: the HF and GGUF name maps and
shape checks, the model's parameter shapes (``modeling.LayerStack``), parameter counts and the HF export.
A Llama-like architecture (same computation, other names or defaults) is one ``ArchitectureSchema`` entry
in ``SCHEMAS``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atp_jax.models.config import ModelConfig

LAYER = "{layer}"  # the layer-index placeholder of per-layer names
_INITS = ("normal", "ones")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One weight tensor of an architecture.

    Attributes:
        hf_name: HF state-dict name; ``{layer}`` stands for the layer index of a per-layer tensor.
        gguf_name: llama.cpp's name for the same tensor, with the same placeholder.
        field: path of the model parameter it fills; per-layer tensors live under ``layers.``.
        shape: the HF ``(out, in)`` shape as ``ModelConfig`` attribute names, e.g. ``("q_dim", "hidden_size")``.
        transpose: the model stores it as ``(in, out)`` (kernels used as ``x @ w``).
        present_if: a boolean ``ModelConfig`` attribute that must hold for the tensor to exist; None: always.
        rotary: its rows are per-head rotary halves (q/k weights and biases); llama.cpp interleaves them
            in architectures whose schema says ``gguf_rotary_interleaved``.
        init: random initialisation: ``"normal"`` (scaled normal) or ``"ones"`` (norm weights).
        split: ``(hf_axis, units)``: the HF axis split across the mesh's ``model`` axis (0 = out, 1 = in) and
            the ``ModelConfig`` attribute counting what it splits (heads, KV heads, MLP units, vocabulary),
            which must divide evenly; None: replicated (norms). See ``atp_jax.models.partitioning``.
    """

    hf_name: str
    gguf_name: str
    field: str
    shape: tuple[str, ...]
    transpose: bool = False
    present_if: str | None = None
    rotary: bool = False
    init: str = "normal"
    split: tuple[int, str] | None = None

    def __post_init__(self):
        if (LAYER in self.hf_name) != (LAYER in self.gguf_name) or (LAYER in self.hf_name) != self.field.startswith(
            "layers."
        ):
            raise ValueError(f"{self.hf_name}: per-layer names and a layers. field go together")
        if self.transpose and len(self.shape) != 2:
            raise ValueError(f"{self.hf_name}: only a matrix can be stored transposed")
        if self.init not in _INITS:
            raise ValueError(f"{self.hf_name}: init {self.init!r} is not one of {_INITS}")
        if self.split is not None and not 0 <= self.split[0] < len(self.shape):
            raise ValueError(f"{self.hf_name}: split axis {self.split[0]} is not an axis of {self.shape}")

    @property
    def per_layer(self) -> bool:
        return LAYER in self.hf_name

    @property
    def attribute(self) -> str:
        """The parameter's attribute name on its module (``q_proj`` for ``layers.q_proj``)."""
        return self.field.rsplit(".", 1)[-1]

    def present(self, config: ModelConfig) -> bool:
        return self.present_if is None or bool(getattr(config, self.present_if))

    def hf_shape(self, config: ModelConfig) -> tuple[int, ...]:
        """HF ``(out, in)`` shape of one tensor (one layer's, for a per-layer tensor)."""
        return tuple(int(getattr(config, dim)) for dim in self.shape)

    def model_shape(self, config: ModelConfig) -> tuple[int, ...]:
        """The model parameter's shape: ``[L, ...]`` for per-layer tensors, transposed where stored so."""
        shape = self.hf_shape(config)
        if self.transpose:
            shape = shape[::-1]
        return (config.num_layers, *shape) if self.per_layer else shape

    def hf_name_of(self, layer: int | None = None) -> str:
        return self.hf_name.replace(LAYER, str(layer)) if self.per_layer else self.hf_name

    def gguf_name_of(self, layer: int | None = None) -> str:
        return self.gguf_name.replace(LAYER, str(layer)) if self.per_layer else self.gguf_name


@functools.cache
def _name_pattern(name: str) -> re.Pattern:
    return re.compile(re.escape(name).replace(re.escape(LAYER), r"(\d+)"))


@dataclasses.dataclass(frozen=True)
class ArchitectureSchema:
    """The tensor set of one architecture and what differs between architectures that share a computation.

    Attributes:
        name: HF ``model_type``, also GGUF's ``general.architecture``.
        tensors: every tensor the architecture can have, in the order the model creates its parameters.
        gguf_rotary_interleaved: llama.cpp's converter reorders q/k rows of this architecture (see
            ``TensorSpec.rotary``); loading a GGUF undoes it.
        attention_bias_default: whether q/k/v biases exist when an HF config does not say
            (``attention_bias`` absent).
        hf_ignored: regexes of HF names some checkpoints carry that the model derives itself.
    """

    name: str
    tensors: tuple[TensorSpec, ...]
    gguf_rotary_interleaved: bool = False
    attention_bias_default: bool = False
    hf_ignored: tuple[str, ...] = (r".*rotary_emb\.inv_freq",)

    def __post_init__(self):
        for key in ("hf_name", "gguf_name", "field"):
            values = [getattr(t, key) for t in self.tensors]
            if len(set(values)) != len(values):
                raise ValueError(f"{self.name}: duplicate {key} in the schema")

    def tensors_for(self, config: ModelConfig) -> tuple[TensorSpec, ...]:
        """The tensors a model of ``config`` has, in schema order."""
        return tuple(t for t in self.tensors if t.present(config))

    def is_ignored(self, hf_name: str) -> bool:
        return any(re.fullmatch(pattern, hf_name) for pattern in self.hf_ignored)

    def find_hf(self, hf_name: str) -> tuple[TensorSpec, int | None] | None:
        """The spec and layer index (None for a global tensor) an HF name belongs to; None if unknown."""
        return _find(hf_name, self.tensors, "hf_name")

    def find_gguf(self, gguf_name: str) -> tuple[TensorSpec, int | None] | None:
        """The spec and layer index a GGUF tensor name belongs to; None if unknown."""
        return _find(gguf_name, self.tensors, "gguf_name")


def _find(name: str, tensors: tuple[TensorSpec, ...], key: str) -> tuple[TensorSpec, int | None] | None:
    for spec in tensors:
        match = _name_pattern(getattr(spec, key)).fullmatch(name)
        if match:
            return spec, (int(match.group(1)) if spec.per_layer else None)
    return None


def _block(hf: str, gguf: str, attribute: str, shape: tuple[str, ...], **kwargs) -> TensorSpec:
    return TensorSpec(f"model.layers.{LAYER}.{hf}", f"blk.{LAYER}.{gguf}", f"layers.{attribute}", shape, **kwargs)


# Tensor parallelism (Megatron's): q/k/v and gate/up split by output units (whole heads, MLP units), o/down by
# input units, so attention and the MLP need one all-reduce each; embeddings and head by vocabulary.
_HEADS_OUT = (0, "num_heads")
_KV_HEADS_OUT = (0, "num_kv_heads")
_UNITS_OUT = (0, "intermediate_size")
_VOCAB = (0, "vocab_size")

# The Llama computation (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP). The order is the order in
# which the model draws its random parameters, so seeded random models stay what they were.
_LLAMA_LIKE_TENSORS = (
    TensorSpec(
        "model.embed_tokens.weight", "token_embd.weight", "embed_tokens", ("vocab_size", "hidden_size"), split=_VOCAB
    ),
    _block("input_layernorm.weight", "attn_norm.weight", "attn_norm", ("hidden_size",), init="ones"),
    _block(
        "self_attn.q_proj.weight",
        "attn_q.weight",
        "q_proj",
        ("q_dim", "hidden_size"),
        transpose=True,
        rotary=True,
        split=_HEADS_OUT,
    ),
    _block(
        "self_attn.k_proj.weight",
        "attn_k.weight",
        "k_proj",
        ("kv_dim", "hidden_size"),
        transpose=True,
        rotary=True,
        split=_KV_HEADS_OUT,
    ),
    _block(
        "self_attn.v_proj.weight",
        "attn_v.weight",
        "v_proj",
        ("kv_dim", "hidden_size"),
        transpose=True,
        split=_KV_HEADS_OUT,
    ),
    _block(
        "self_attn.q_proj.bias",
        "attn_q.bias",
        "q_bias",
        ("q_dim",),
        present_if="attention_bias",
        rotary=True,
        split=_HEADS_OUT,
    ),
    _block(
        "self_attn.k_proj.bias",
        "attn_k.bias",
        "k_bias",
        ("kv_dim",),
        present_if="attention_bias",
        rotary=True,
        split=_KV_HEADS_OUT,
    ),
    _block(
        "self_attn.v_proj.bias", "attn_v.bias", "v_bias", ("kv_dim",), present_if="attention_bias", split=_KV_HEADS_OUT
    ),
    _block(
        "self_attn.o_proj.weight",
        "attn_output.weight",
        "o_proj",
        ("hidden_size", "q_dim"),
        transpose=True,
        split=(1, "num_heads"),
    ),
    _block("post_attention_layernorm.weight", "ffn_norm.weight", "mlp_norm", ("hidden_size",), init="ones"),
    _block(
        "mlp.gate_proj.weight",
        "ffn_gate.weight",
        "gate_proj",
        ("intermediate_size", "hidden_size"),
        transpose=True,
        split=_UNITS_OUT,
    ),
    _block(
        "mlp.up_proj.weight",
        "ffn_up.weight",
        "up_proj",
        ("intermediate_size", "hidden_size"),
        transpose=True,
        split=_UNITS_OUT,
    ),
    _block(
        "mlp.down_proj.weight",
        "ffn_down.weight",
        "down_proj",
        ("hidden_size", "intermediate_size"),
        transpose=True,
        split=(1, "intermediate_size"),
    ),
    TensorSpec("model.norm.weight", "output_norm.weight", "final_norm", ("hidden_size",), init="ones"),
    TensorSpec(
        "lm_head.weight",
        "output.weight",
        "lm_head",
        ("vocab_size", "hidden_size"),
        transpose=True,
        present_if="untied_head",
        split=_VOCAB,
    ),
)

SCHEMAS: dict[str, ArchitectureSchema] = {
    schema.name: schema
    for schema in (
        # llama.cpp permutes q/k rows only for llama; Qwen2 always has q/k/v biases.
        ArchitectureSchema("llama", _LLAMA_LIKE_TENSORS, gguf_rotary_interleaved=True),
        ArchitectureSchema("qwen2", _LLAMA_LIKE_TENSORS, attention_bias_default=True),
    )
}

SUPPORTED_ARCHITECTURES = tuple(SCHEMAS)


def schema_for(architecture: str) -> ArchitectureSchema:
    """The schema of ``architecture`` (an HF ``model_type``); ``ValueError`` listing the supported ones."""
    try:
        return SCHEMAS[architecture]
    except KeyError:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        ) from None
