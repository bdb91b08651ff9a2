"""Where each weight lives on a mesh: tensor parallelism over the ``model`` axis, copies along ``data``.

The schema says which HF axis of each tensor splits and what it counts (``TensorSpec.split``): q/k/v and
gate/up by output units (whole heads, MLP units), o and down by input units, embeddings and an untied head
by vocabulary; norms are replicated. A device then holds 1/M of every large tensor (M = the ``model``
axis's size) and computes its heads and its MLP units of every token, with one all-reduce after attention
and one after the MLP.

When the units do not divide by M the other axis of the matrix is split instead where it divides: with
fewer KV heads than devices (Qwen2.5 has 2 or 4) the k/v projections split along the hidden size, their
partial products are summed across the model axis, and the KV heads are then whole (replicated) on every
device, each device attending with its own query heads. Only where neither axis divides does a tensor
stay whole on every device (biases of such heads).
"""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from atp_jax.models.config import ModelConfig
from atp_jax.models.schema import TensorSpec, schema_for
from atp_jax.sharding import MODEL, axis_size


def split_hf_axis(spec: TensorSpec, config: ModelConfig, model_size: int) -> int | None:
    """The HF axis of ``spec``'s tensor split over ``model_size`` devices, or None (whole on each)."""
    if model_size == 1 or spec.split is None:
        return None
    hf_axis, units = spec.split
    shape = spec.hf_shape(config)
    if getattr(config, units) % model_size == 0 and shape[hf_axis] % model_size == 0:
        return hf_axis
    other = 1 - hf_axis
    if len(shape) == 2 and shape[other] % model_size == 0:
        return other
    return None


def partition_spec(spec: TensorSpec, config: ModelConfig, model_size: int) -> PartitionSpec:
    """The ``PartitionSpec`` of the model parameter ``spec`` fills (model layout: ``[L, ...]``, transposed
    kernels)."""
    parts: list[str | None] = [None] * len(spec.shape)
    axis = split_hf_axis(spec, config, model_size)
    if axis is not None:
        parts[axis] = MODEL
    if spec.transpose:
        parts = parts[::-1]
    if spec.per_layer:
        parts = [None, *parts]
    return PartitionSpec(*parts)


def weight_shardings(config: ModelConfig, mesh: Mesh) -> dict[str, NamedSharding]:
    """``{model field: NamedSharding}`` of every parameter of a ``config`` model on ``mesh``."""
    model_size = axis_size(mesh, MODEL)
    return {
        spec.field: NamedSharding(mesh, partition_spec(spec, config, model_size))
        for spec in schema_for(config.architecture).tensors_for(config)
    }
