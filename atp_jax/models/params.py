"""HF tensor names -> the stacked NNX ``Transformer``, streamed tensor by tensor.

Sources (safetensors shards, a GGUF file) yield ``(hf_name, array)`` pairs in HF's ``(out, in)``
layout. Each is transposed and copied into one preallocated per-field array (layers stacked on a
leading axis) in the target dtype, so a load holds the final weights plus one tensor in flight.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 as a numpy dtype)
import numpy as np
from flax import nnx

from atp_jax.models.config import ModelConfig
from atp_jax.models.modeling import Transformer

# HF name pattern -> (field path in the model, transpose?). Layer fields get the layer index from \1.
_NAME_TABLE: tuple[tuple[str, str, bool], ...] = (
    (r"model\.embed_tokens\.weight", "embed_tokens", False),
    (r"model\.norm\.weight", "final_norm", False),
    (r"lm_head\.weight", "lm_head", True),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "layers.attn_norm", False),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "layers.mlp_norm", False),
    (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight", r"layers.\2_proj", True),
    (r"model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.bias", r"layers.\2_bias", False),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"layers.\2_proj", True),
)
# Buffers some checkpoints carry that the model derives itself.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


class WeightsError(ValueError):
    """Checkpoint tensors that do not fit the config (missing, unexpected or misshapen)."""


def hf_to_field(name: str) -> tuple[str, int | None, bool] | None:
    """Maps an HF tensor name to (field path, layer index or None, transpose?); None if ignored."""
    if _IGNORED.match(name):
        return None
    for pattern, field, transpose in _NAME_TABLE:
        m = re.fullmatch(pattern, name)
        if m:
            layer = int(m.group(1)) if m.groups() else None
            return m.expand(field), layer, transpose
    raise WeightsError(f"unexpected tensor {name!r}: not part of a Llama/Qwen2 decoder")


def _flatten(tree, prefix=""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def build_model(
    config: ModelConfig, tensors: Iterable[tuple[str, np.ndarray]], dtype=jnp.float32, source: str = "checkpoint"
) -> Transformer:
    """Creates a ``Transformer`` whose weights come from ``tensors`` (HF names, (out, in) layout)."""
    abstract = nnx.eval_shape(lambda: Transformer(config, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shapes = dict(_flatten(nnx.to_pure_dict(state)))
    np_dtype = np.dtype(jnp.dtype(dtype))
    buffers = {path: np.empty(s.shape, np_dtype) for path, s in shapes.items()}
    filled = {path: np.zeros(s.shape[0] if path.startswith("layers.") else 1, bool) for path, s in shapes.items()}

    for name, array in tensors:
        target = hf_to_field(name)
        if target is None:
            continue
        field, layer, transpose = target
        if field not in buffers:
            raise WeightsError(f"{source}: tensor {name!r} has no place in this config (field {field})")
        value = array.T if transpose else array
        slot = buffers[field] if layer is None else buffers[field][layer]
        if value.shape != slot.shape:
            raise WeightsError(f"{source}: tensor {name!r} has shape {array.shape}, config implies {slot.shape}")
        slot[...] = value
        filled[field][0 if layer is None else layer] = True

    missing = [f"{path}[{i}]" if path.startswith("layers.") else path for path, f in filled.items() for i in np.flatnonzero(~f)]
    if missing:
        raise WeightsError(f"{source}: missing tensors for {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}")

    nested: dict = {}
    for path, value in buffers.items():
        node = nested
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = jnp.asarray(value)
        buffers[path] = None  # drop the host copy as soon as the device copy exists
    nnx.replace_by_pure_dict(state, nested)
    return nnx.merge(graphdef, state)


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yields every tensor of an HF directory's safetensors shard(s), one at a time, as numpy."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / shard for shard in shards]
        absent = [str(f.name) for f in files if not f.exists()]
        if absent:
            raise WeightsError(f"{index}: lists shards that are not in the directory: {', '.join(absent)}")
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{model_dir}: no *.safetensors files (pickled .bin checkpoints are not loaded)")
    for file in files:
        # The "flax" framework reads bfloat16 too; numpy's backend cannot.
        with safe_open(str(file), framework="flax") as f:
            for name in f.keys():
                yield name, np.asarray(jax.device_get(f.get_tensor(name)))
