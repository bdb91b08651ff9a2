"""HF tensor names <-> the stacked NNX ``Transformer``: streamed loading and the HF export.

Sources (safetensors shards, a GGUF file) yield tensors under their HF names in HF's ``(out, in)``
layout, whole or as blocks of rows. Each is transposed where the schema says and cast to the target
dtype on the host, then written into one preallocated device array per model field (layers stacked on a
leading axis); the write donates the array, so it happens in place. A load therefore holds the final
weights plus the block in flight. Which name goes where, and with which shape, comes from
``atp_jax.models.schema``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 as a numpy dtype)
import numpy as np
from flax import nnx

from atp_jax.models.config import ModelConfig
from atp_jax.models.modeling import Transformer
from atp_jax.models.schema import TensorSpec, schema_for


class WeightsError(ValueError):
    """Checkpoint tensors that do not fit the config (missing, unexpected or misshapen)."""


class RowBlock(NamedTuple):
    """Rows ``start .. start + len(array)`` of the HF tensor ``name`` (``(out, in)`` layout, or ``(n,)``)."""

    name: str
    start: int
    array: np.ndarray


def _find(name: str, config: ModelConfig) -> tuple[TensorSpec, int | None] | None:
    schema = schema_for(config.architecture)
    if schema.is_ignored(name):
        return None
    found = schema.find_hf(name)
    if found is None:
        raise WeightsError(f"unexpected tensor {name!r}: not part of a {config.architecture} decoder")
    return found


def build_model(
    config: ModelConfig, tensors: Iterable[tuple[str, np.ndarray]], dtype=jnp.float32, source: str = "checkpoint"
) -> Transformer:
    """Creates a ``Transformer`` whose weights come from ``tensors`` (HF names, (out, in) layout)."""
    return build_model_from_blocks(config, _whole_tensors(config, tensors, source), dtype, source)


def _whole_tensors(config: ModelConfig, tensors: Iterable[tuple[str, np.ndarray]], source: str) -> Iterator[RowBlock]:
    for name, array in tensors:
        found = _find(name, config)
        if found is not None and found[0].present(config) and array.shape != found[0].hf_shape(config):
            raise WeightsError(
                f"{source}: tensor {name!r} has shape {array.shape}, config implies {found[0].hf_shape(config)}"
            )
        yield RowBlock(name, 0, array)


def build_model_from_blocks(
    config: ModelConfig, blocks: Iterable[RowBlock], dtype=jnp.float32, source: str = "checkpoint"
) -> Transformer:
    """Creates a ``Transformer`` from tensors that may arrive in blocks of rows (see ``RowBlock``).

    Every row of every tensor the config implies must arrive exactly once; ``WeightsError`` names the
    missing, unexpected or misshapen ones.
    """
    abstract = nnx.eval_shape(lambda: Transformer(config, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    specs = {spec.field: spec for spec in schema_for(config.architecture).tensors_for(config)}
    shapes = dict(_flatten(nnx.to_pure_dict(state)))
    if set(shapes) != set(specs):  # the model's fields are the schema's by construction
        raise AssertionError(f"model fields {sorted(shapes)} differ from the schema's {sorted(specs)}")
    np_dtype = np.dtype(jnp.dtype(dtype))
    buffers = {field: _zeros(s.shape, np_dtype) for field, s in shapes.items()}
    # HF rows received per (field, layer): a tensor is complete when all of its rows arrived.
    received = {field: np.zeros(config.num_layers if spec.per_layer else 1, np.int64) for field, spec in specs.items()}

    in_flight = None
    for name, start, array in blocks:
        found = _find(name, config)
        if found is None:
            continue
        spec, layer = found
        if spec.field not in buffers:
            raise WeightsError(f"{source}: tensor {name!r} has no place in this config (field {spec.field})")
        if spec.per_layer and layer >= config.num_layers:
            raise WeightsError(f"{source}: tensor {name!r} is for layer {layer}; the config has {config.num_layers}")
        expected = spec.hf_shape(config)
        if not _fits(array.shape, start, expected):
            shown = array.shape if start == 0 else f"{array.shape} at row {start}"
            raise WeightsError(f"{source}: tensor {name!r} has shape {shown}, config implies {expected}")
        slot = 0 if layer is None else layer
        if received[spec.field][slot] + array.shape[0] > expected[0]:
            raise WeightsError(f"{source}: tensor {name!r} arrived more than once")
        if in_flight is not None:
            # Writes run asynchronously, each holding its block: wait for the last one so that blocks
            # cannot pile up when the source is faster than the writes.
            in_flight.block_until_ready()
        # Transposed and cast on the host, where numpy does it in one pass over the block.
        value = np.ascontiguousarray(array.T if spec.transpose else array, dtype=np_dtype)
        buffers[spec.field] = in_flight = _write(
            buffers[spec.field], value, slot, start, per_layer=spec.per_layer, rows_last=spec.transpose
        )
        received[spec.field][slot] += array.shape[0]

    missing = [
        f"{field}[{i}]" if specs[field].per_layer else field
        for field, rows in received.items()
        for i in np.flatnonzero(rows < specs[field].hf_shape(config)[0])
    ]
    if missing:
        more = " …" if len(missing) > 8 else ""
        raise WeightsError(f"{source}: missing tensors for {', '.join(missing[:8])}{more}")

    nested: dict = {}
    for field, value in buffers.items():
        node = nested
        *parents, leaf = field.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    nnx.replace_by_pure_dict(state, nested)
    return nnx.merge(graphdef, state)


def _fits(shape: tuple[int, ...], start: int, expected: tuple[int, ...]) -> bool:
    """Whether a block of ``shape`` at HF row ``start`` lies inside a tensor of shape ``expected``."""
    return len(shape) == len(expected) and shape[1:] == expected[1:] and 0 <= start <= expected[0] - shape[0]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _zeros(shape, dtype):
    return jnp.zeros(shape, dtype)


@functools.partial(jax.jit, static_argnames=("per_layer", "rows_last"), donate_argnums=0)
def _write(buffer, value, layer, start, *, per_layer: bool, rows_last: bool):
    """``buffer`` with one tensor's rows ``start ..`` (of ``layer``) replaced by ``value``, in place.

    ``value`` is in the model's layout (HF rows are its last axis where the model stores ``(in, out)``) and
    dtype.
    """
    index = [0] * value.ndim
    index[-1 if rows_last else 0] = start
    if per_layer:
        value, index = value[None], [layer, *index]
    if buffer.dtype.itemsize >= 4:
        return jax.lax.dynamic_update_slice(buffer, value, index)
    # XLA's CPU backend does a 16-bit float slice update by converting the whole buffer; on its
    # integer view the update stays a slice update.
    bits = jnp.dtype(f"uint{8 * buffer.dtype.itemsize}")
    updated = jax.lax.dynamic_update_slice(
        jax.lax.bitcast_convert_type(buffer, bits), jax.lax.bitcast_convert_type(value, bits), index
    )
    return jax.lax.bitcast_convert_type(updated, buffer.dtype)


def _flatten(tree, prefix=""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def export_hf(model: Transformer) -> dict[str, np.ndarray]:
    """The model's weights under their HF names, in HF's ``(out, in)`` layout and the model's dtype.

    The inverse of ``build_model``: ``build_model(config, export_hf(model).items())`` rebuilds ``model``. A
    tied head has no ``lm_head.weight`` (HF's state dict lists it only as the embedding). Arrays are numpy
    views of one host copy of each field.
    """
    config = model.config
    state = dict(_flatten(nnx.to_pure_dict(nnx.state(model))))
    exported = {}
    for spec in schema_for(config.architecture).tensors_for(config):
        host = np.asarray(jax.device_get(state[spec.field]))
        for layer in range(config.num_layers) if spec.per_layer else (None,):
            value = host if layer is None else host[layer]
            exported[spec.hf_name_of(layer)] = value.T if spec.transpose else value
    return exported


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
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict: it has no __iter__)
                yield name, np.asarray(jax.device_get(f.get_tensor(name)))
