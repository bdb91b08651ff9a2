"""The device mesh: a ``data`` axis for independent sequences and a ``model`` axis for the weights.

A process spreads its work over its local devices (processes never exchange arrays: each takes its own
examples). ``--mesh data=2,model=4`` arranges them in a ``jax.sharding.Mesh``:

* ``model``: the weights are split across these devices, tensor-parallel (attention heads, MLP hidden
  units and the vocabulary; see ``atp_jax.models.partitioning``), so a model too large for one device fits
  on several and each device does its share of every sequence's arithmetic.
* ``data``: independent sequences (ATP restarts, candidate orders of a batch) are split across these;
  each data slice holds a whole copy of the (model-sharded) weights.

Arrays are placed with a ``NamedSharding`` before a jitted call and ``jit`` propagates the placement through
the computation (the axes are ``AxisType.Auto``). A mesh of one device is ``None`` everywhere: then nothing is
placed and every array lives on JAX's default device, as in a single-device program.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DATA = "data"
MODEL = "model"
AXES = (DATA, MODEL)


class MeshError(ValueError):
    """A ``--mesh`` value that does not describe these devices; the message says how to fix it."""


def parse_mesh(text: str | None) -> dict[str, int]:
    """``"data=2,model=4"`` -> ``{"data": 2, "model": 4}``; axes left out are absent from the result.

    An empty or None value means the default (every device on ``data``).
    """
    sizes: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in AXES:
            raise MeshError(f"--mesh {text!r}: {part.strip()!r} is not AXIS=SIZE with AXIS one of {', '.join(AXES)}")
        if name in sizes:
            raise MeshError(f"--mesh {text!r}: axis {name!r} given twice")
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size < 1:
            raise MeshError(f"--mesh {text!r}: the size of {name!r} must be a positive integer, got {value.strip()!r}")
        sizes[name] = size
    return sizes


def mesh_shape(sizes: Mapping[str, int], device_count: int) -> tuple[int, int]:
    """``(data, model)`` for ``device_count`` devices: ``model`` defaults to 1 and ``data`` to what is left.

    Explicit sizes may use fewer devices than there are (the first ones); never more.
    """
    model = sizes.get(MODEL, 1)
    if DATA in sizes:
        data = sizes[DATA]
    else:
        if device_count % model:
            raise MeshError(
                f"--mesh model={model}: {device_count} devices do not split into groups of {model}; "
                f"give data= too (data × model ≤ {device_count}) or choose a model size dividing {device_count}"
            )
        data = device_count // model
    if data * model > device_count:
        raise MeshError(
            f"--mesh data={data},model={model} needs {data * model} devices; this process has {device_count}"
        )
    return data, model


def make_mesh(spec: str | Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh | None:
    """The ``(data, model)`` mesh over this process's devices (``jax.local_devices()`` unless given), or None
    when it has one device (a single-device program: nothing to place).

    ``spec``: a ``--mesh`` string, a ``{"data": d, "model": m}`` mapping, or None for every device on ``data``.
    """
    devices = list(jax.local_devices() if devices is None else devices)
    sizes = parse_mesh(spec) if spec is None or isinstance(spec, str) else dict(spec)
    data, model = mesh_shape(sizes, len(devices))
    if data * model == 1:
        return None
    return jax.make_mesh(
        (data, model), AXES, axis_types=(AxisType.Auto, AxisType.Auto), devices=devices[: data * model]
    )


def axis_size(mesh: Mesh | None, axis: str) -> int:
    """Devices along ``axis`` (1 without a mesh)."""
    return 1 if mesh is None else int(mesh.shape[axis])


def describe(mesh: Mesh | None) -> str:
    """``data=2,model=4`` (the ``--mesh`` form of the mesh), ``data=1,model=1`` without one."""
    return f"{DATA}={axis_size(mesh, DATA)},{MODEL}={axis_size(mesh, MODEL)}"


def batch_spec(mesh: Mesh | None, batch: int) -> str | None:
    """The mesh axis a leading batch dimension of ``batch`` splits over: ``data`` when it divides evenly."""
    size = axis_size(mesh, DATA)
    return DATA if size > 1 and batch % size == 0 else None


def place_batch(array, mesh: Mesh | None):
    """A host (or device) array on the mesh with its leading axis split over ``data`` where it divides evenly,
    else replicated; without a mesh, on the default device. Works for typed PRNG key arrays too."""
    if mesh is None:  # a transfer: jnp.asarray would compile a program per shape to stage the array
        return array if isinstance(array, jax.Array) else jax.device_put(array)
    return jax.device_put(array, NamedSharding(mesh, PartitionSpec(batch_spec(mesh, array.shape[0]))))


def device_bytes(tree) -> dict[jax.Device, int]:
    """Bytes each device holds of the arrays in ``tree`` (its shards, replicas counted on every device)."""
    held: dict[jax.Device, int] = {}
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held
