"""HF tensor names <-> the stacked NNX ``Transformer``: streamed loading and the HF export.

Sources (safetensors shards, a GGUF file) yield tensors under their HF names in HF's ``(out, in)``
layout, whole or as blocks of rows. Each is transposed where the schema says and cast to the target
dtype on the host, then written into one preallocated device array per model field (layers stacked on a
leading axis) — on a mesh, one per device holding that device's shard, which receives only its part of
the block. The write donates the array, so it happens in place. A load therefore holds the final
weights plus the block in flight, and no device ever holds more than its own shards. Which name goes
where, and with which shape, comes from ``atp_jax.models.schema``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 as a numpy dtype)
import numpy as np
from flax import nnx
from flax.traverse_util import unflatten_dict
from jax.sharding import Mesh, NamedSharding

from atp_jax.models.config import ModelConfig
from atp_jax.models.modeling import Transformer
from atp_jax.models.partitioning import weight_shardings
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
    config: ModelConfig,
    tensors: Iterable[tuple[str, np.ndarray]],
    dtype=jnp.float32,
    source: str = "checkpoint",
    mesh: Mesh | None = None,
) -> Transformer:
    """Creates a ``Transformer`` whose weights come from ``tensors`` (HF names, (out, in) layout), placed on
    ``mesh`` when given (see ``build_model_from_blocks``)."""
    return build_model_from_blocks(config, _whole_tensors(config, tensors, source), dtype, source, mesh)


def _whole_tensors(config: ModelConfig, tensors: Iterable[tuple[str, np.ndarray]], source: str) -> Iterator[RowBlock]:
    for name, array in tensors:
        found = _find(name, config)
        if found is not None and found[0].present(config) and array.shape != found[0].hf_shape(config):
            raise WeightsError(
                f"{source}: tensor {name!r} has shape {array.shape}, config implies {found[0].hf_shape(config)}"
            )
        yield RowBlock(name, 0, array)


def build_model_from_blocks(
    config: ModelConfig,
    blocks: Iterable[RowBlock],
    dtype=jnp.float32,
    source: str = "checkpoint",
    mesh: Mesh | None = None,
) -> Transformer:
    """Creates a ``Transformer`` from tensors that may arrive in blocks of rows (see ``RowBlock``).

    Every row of every tensor the config implies must arrive exactly once; ``WeightsError`` names the
    missing, unexpected or misshapen ones. With a ``mesh`` each device receives only the part of each block
    that falls in its shard (``atp_jax.models.partitioning``), so no device ever holds more than its shards.
    """
    abstract = nnx.eval_shape(lambda: Transformer(config, dtype=dtype, rngs=nnx.Rngs(0), mesh=mesh))
    graphdef, state = nnx.split(abstract)
    specs = {spec.field: spec for spec in schema_for(config.architecture).tensors_for(config)}
    shapes = dict(_flatten(nnx.to_pure_dict(state)))
    if set(shapes) != set(specs):  # the model's fields are the schema's by construction
        raise AssertionError(f"model fields {sorted(shapes)} differ from the schema's {sorted(specs)}")
    np_dtype = np.dtype(jnp.dtype(dtype))
    shardings = weight_shardings(config, mesh) if mesh is not None else {}
    buffers = {field: _FieldBuffer(s.shape, np_dtype, shardings.get(field)) for field, s in shapes.items()}
    # HF rows received per (field, layer): a tensor is complete when all of its rows arrived.
    received = {field: np.zeros(config.num_layers if spec.per_layer else 1, np.int64) for field, spec in specs.items()}

    in_flight: list[jax.Array] = []
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
        # Writes run asynchronously, each holding its block: wait for the last block's before the next, so that
        # blocks cannot pile up when the source is faster than the writes.
        jax.block_until_ready(in_flight)
        # Transposed and cast on the host, where numpy does it in one pass over the block.
        value = np.ascontiguousarray(array.T if spec.transpose else array, dtype=np_dtype)
        in_flight = buffers[spec.field].write(value, layer, start, rows_axis=value.ndim - 1 if spec.transpose else 0)
        received[spec.field][slot] += array.shape[0]

    missing = [
        f"{field}[{i}]" if specs[field].per_layer else field
        for field, rows in received.items()
        for i in np.flatnonzero(rows < specs[field].hf_shape(config)[0])
    ]
    if missing:
        more = " …" if len(missing) > 8 else ""
        raise WeightsError(f"{source}: missing tensors for {', '.join(missing[:8])}{more}")

    weights = {field: buffer.array() for field, buffer in buffers.items()}
    nnx.replace_by_pure_dict(state, unflatten_dict(weights, sep="."))
    return nnx.merge(graphdef, state)


def random_blocks(config: ModelConfig, seed: int = 0, block_elements: int = 1 << 22) -> Iterator[RowBlock]:
    """Seeded random weights under their HF names, in blocks of rows: N(0, 0.02²), ones for norm weights.

    The block of rows ``start ..`` of tensor ``t`` (schema order) in layer ``l`` comes from numpy's generator
    seeded by ``(seed, t, l + 1, start)`` (``l + 1 = 0`` for a global tensor), so the values do not depend on
    who reads them, in what order or onto which devices.
    """
    for index, spec in enumerate(schema_for(config.architecture).tensors_for(config)):
        shape = spec.hf_shape(config)
        per_block = max(1, block_elements // math.prod(shape[1:]))
        for layer in range(config.num_layers) if spec.per_layer else (None,):
            for start in range(0, shape[0], per_block):
                block_shape = (min(per_block, shape[0] - start), *shape[1:])
                if spec.init == "ones":
                    block = np.ones(block_shape, np.float32)
                else:
                    rng = np.random.default_rng([seed, index, 0 if layer is None else layer + 1, start])
                    block = rng.standard_normal(block_shape, np.float32)
                    block *= 0.02
                yield RowBlock(spec.hf_name_of(layer), start, block)


def random_model(config: ModelConfig, seed: int = 0, dtype=jnp.float32, mesh: Mesh | None = None) -> Transformer:
    """A decoder with seeded random weights (``random_blocks``) for tests and benchmarks of named architectures.

    Built like a checkpoint, block by block on the host, so it costs the weights plus one block of memory, and
    on a ``mesh`` each device receives only its shards: the same model whatever the mesh.
    """
    return build_model_from_blocks(config, random_blocks(config, seed), dtype, f"random weights (seed {seed})", mesh)


def _fits(shape: tuple[int, ...], start: int, expected: tuple[int, ...]) -> bool:
    """Whether a block of ``shape`` at HF row ``start`` lies inside a tensor of shape ``expected``."""
    return len(shape) == len(expected) and shape[1:] == expected[1:] and 0 <= start <= expected[0] - shape[0]


class _FieldBuffer:
    """One model parameter being filled: a zeroed buffer per device holding that device's shard.

    Without a sharding there is one buffer on JAX's default device, the whole parameter. Each block is
    cut to each device's shard on the host and written into that device's buffer in place.
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, sharding: NamedSharding | None):
        self.shape, self.sharding = shape, sharding
        if sharding is None:
            bounds = {None: (0,) * len(shape)}
        else:
            bounds = {
                device: tuple(s.indices(n)[0] for s, n in zip(index, shape))
                for device, index in sharding.addressable_devices_indices_map(shape).items()
            }
        self.starts = bounds  # device -> first index of its shard along each axis
        local = shape if sharding is None else sharding.shard_shape(shape)
        self.local_shape = local
        self.buffers = {device: _zeros(local, dtype, device) for device in bounds}

    def write(self, value: np.ndarray, layer: int | None, start: int, rows_axis: int) -> list[jax.Array]:
        """Writes ``value`` (the parameter's layout without the layer axis; rows ``start ..`` along ``rows_axis``,
        whole along the others) into layer ``layer``; returns the writes in flight."""
        lo = [0] * value.ndim
        lo[rows_axis] = start
        if layer is not None:
            value, lo = value[None], [layer, *lo]
        hi = [a + n for a, n in zip(lo, value.shape)]
        written = []
        for device, first in self.starts.items():
            top = [a + n for a, n in zip(first, self.local_shape)]
            begin = [max(a, b) for a, b in zip(lo, first)]
            end = [min(a, b) for a, b in zip(hi, top)]
            if any(b >= e for b, e in zip(begin, end)):
                continue  # this block has nothing in the device's shard
            piece = value[tuple(slice(b - a, e - a) for a, b, e in zip(lo, begin, end))]
            offsets = tuple(np.int32(b - f) for b, f in zip(begin, first))
            self.buffers[device] = _write(self.buffers[device], np.ascontiguousarray(piece), offsets)
            written.append(self.buffers[device])
        return written

    def array(self) -> jax.Array:
        if self.sharding is None:
            return self.buffers[None]
        return jax.make_array_from_single_device_arrays(self.shape, self.sharding, list(self.buffers.values()))


def _zeros(shape, dtype, device):
    return jnp.zeros(shape, dtype, device=device)


@functools.partial(jax.jit, donate_argnums=0)
def _write(buffer, value, offsets):
    """``buffer`` with the block ``value`` written at ``offsets`` (one index per axis), in place."""
    if buffer.dtype.itemsize >= 4:
        return jax.lax.dynamic_update_slice(buffer, value, offsets)
    # XLA's CPU backend does a 16-bit float slice update by converting the whole buffer; on its
    # integer view the update stays a slice update.
    bits = jnp.dtype(f"uint{8 * buffer.dtype.itemsize}")
    updated = jax.lax.dynamic_update_slice(
        jax.lax.bitcast_convert_type(buffer, bits), jax.lax.bitcast_convert_type(value, bits), offsets
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
        # Read on the host (bfloat16 as ml_dtypes' numpy type): the loader cuts each tensor into the devices'
        # shards, so no tensor passes through a device whole.
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict: it has no __iter__)
                yield name, f.get_tensor(name)
