"""Hard projection of a soft permutation: the assignment maximising <P, D>.

Convention (same as `sinkhorn.py` and the layout): `perm[..., a]` is the column chosen for row a,
i.e. the source row/column i placed in slot a, and the permutation matrix is
P[..., a, perm[..., a]] = 1 (`perm_to_matrix`). With D_r from Sinkhorn, perm is σ_r of the design
notes: slot a receives source row σ_r(a) = perm[a].

Two solvers give the same optimum (they may differ only on exact ties):
- "host": `jax.pure_callback` to SciPy's `linear_sum_assignment` (exact, float64 on the host). Under
  `vmap` the callback is batched with `vmap_method="expand_dims"`: the host receives the whole
  [R, ..., k, k] batch in ONE callback and loops over it in NumPy (see `_host_assign`), instead of one
  device->host round trip per restart as `"sequential"` would do.
- "device": `optax.assignment.hungarian_algorithm`, a pure-JAX Hungarian (while-loops, float32); no
  host round trip, vmappable, so it can live inside a jitted step on an accelerator.

Padding (shape buckets): with ``size`` given, only the leading ``[size, size]`` block is real. The host
solves that block alone (the size travels with D into the callback, per batch element); the device
solves the whole matrix — for a Sinkhorn output the pad block is the identity, which the optimum keeps —
and pins the pads in place either way. Pads always map to themselves.

The projection has no gradient: D passes through `stop_gradient` and the result is an integer index.
For straight-through use `D + stop_gradient(perm_to_matrix(perm) - D)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.optimize

# Numerical-stability choices, named so that they can be found and argued about.
# Reason: SciPy raises on NaN (an exception inside a pure_callback is undefined behaviour) and optax's
# float32 dual potentials overflow near float32 max; so non-finite/huge scores are clamped to ±BIG
# before solving (NaN and -inf to -BIG: never preferred; +inf to +BIG), identically for both methods.
_BIG = 1e30

_METHODS = ("host", "device")


def perm_to_matrix(perm: jax.Array, dtype=jnp.float32) -> jax.Array:
    """One-hot permutation matrix.

    Args:
      perm: [..., k] integer, perm[..., a] = column chosen for row a.
      dtype: float dtype of the result.

    Returns:
      P: [..., k, k] with P[..., a, perm[..., a]] = 1 and 0 elsewhere.
    """
    return jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype)


def _sanitize(D: jax.Array) -> jax.Array:
    D = jnp.asarray(D).astype(jnp.float32)
    D = jnp.nan_to_num(D, nan=-_BIG, posinf=_BIG, neginf=-_BIG)
    return jnp.clip(D, -_BIG, _BIG)


def _host_assign(D: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Host side of the "host" method: solves the real ``[s, s]`` block of every [k, k] problem of a
    [..., k, k] batch in a loop (``size`` broadcasts against the batch axes); pads map to themselves.

    Runs once per `pure_callback` invocation; under `vmap(..., vmap_method="expand_dims")` the leading
    axes are the vmapped batch axes (nested vmaps add one each; an unbatched ``size`` gets size-1 axes),
    so any number of them is accepted.
    """
    D = np.asarray(D, dtype=np.float64)  # SciPy works in float64; do the upcast once for the batch
    k = D.shape[-1]
    flat = D.reshape((-1, k, k))
    sizes = np.broadcast_to(np.asarray(size), D.shape[:-2]).reshape(-1)
    out = np.tile(np.arange(k, dtype=np.int32), (flat.shape[0], 1))
    for b in range(flat.shape[0]):
        s = int(sizes[b])
        rows, cols = scipy.optimize.linear_sum_assignment(flat[b, :s, :s], maximize=True)
        out[b, rows] = cols
    return out.reshape(D.shape[:-1])


def _project_host(D: jax.Array, size) -> jax.Array:
    out_type = jax.ShapeDtypeStruct(D.shape[:-1], jnp.int32)
    # "expand_dims": under vmap the callback receives the batched operand with the batch axis in front
    # and must return a batched result - exactly what `_host_assign` does for any leading dims - so R
    # restarts cost one host call. ("broadcast_all" would be identical here, since D is the only operand
    # and is always batched when vmap reaches the callback; "sequential" would make R callbacks;
    # "legacy_vectorized" also passes the batch in one call but keeps the old `vectorized=True` rule of
    # not adding axes to unbatched operands - a compatibility mode, not something to build on.)
    return jax.pure_callback(_host_assign, out_type, D, size, vmap_method="expand_dims")


def _solve_one_device(D: jax.Array) -> jax.Array:
    # optax minimises cost and returns matched pairs (i[t], j[t]); for square inputs which of the two is
    # arange is an implementation detail, so scatter the pairs into row order rather than rely on it.
    i, j = optax.assignment.hungarian_algorithm(-D)
    k = D.shape[-1]
    return jnp.zeros((k,), jnp.int32).at[i].set(j.astype(jnp.int32))


def _project_device(D: jax.Array) -> jax.Array:
    k = D.shape[-1]
    flat = D.reshape((-1, k, k))
    return jax.vmap(_solve_one_device)(flat).reshape(D.shape[:-1])


def project(D: jax.Array, method: str = "host", size=None) -> jax.Array:
    """Hard permutation maximising <P, D> = sum_a D[a, perm[a]].

    Works under `jit` and `vmap` (and with any number of leading batch dims directly). `method` is a
    Python string (static).

    Args:
      D: [..., k, k] scores, typically a Sinkhorn output; any float dtype (solved in float32 on device,
        float64 on host). Non-finite entries are clamped (see `_BIG`).
      method: "host" (SciPy via one batched pure_callback) or "device" (optax Hungarian in JAX).
      size: optional int (may be traced, or batched like D's leading axes): only ``D[..., :size, :size]``
        is real; the pads map to themselves. None: all k.

    Returns:
      perm: [..., k] int32, perm[..., a] = column chosen for row a. No gradient.
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if D.ndim < 2 or D.shape[-1] != D.shape[-2]:
        raise ValueError(f"D must have shape [..., k, k], got {D.shape}")
    # An index has no useful derivative; stopping the gradient also keeps AD away from the callback
    # (no JVP rule) and from optax's while-loops (no reverse mode).
    D = _sanitize(jax.lax.stop_gradient(D))
    if D.shape[-1] == 0:
        return jnp.zeros(D.shape[:-1], jnp.int32)
    k = D.shape[-1]
    if method == "host":
        return _project_host(D, jnp.asarray(k if size is None else size, jnp.int32))
    if size is None:
        return _project_device(D)
    return _project_device(_fix_padding(D, jnp.asarray(size, jnp.int32)))


def _fix_padding(D: jax.Array, size: jax.Array) -> jax.Array:
    """D [..., k, k] with the pad rows/columns (``>= size``; size broadcasts against the batch axes) scored so
    that the optimum maps each pad to itself and solves the real block alone: a pad's diagonal gets the real
    block's maximum, every other pad entry a score so low that any assignment using one loses more than the
    real block could ever gain."""
    k = D.shape[-1]
    index = jnp.arange(k)
    real_index = index < size[..., None]  # [..., k]
    real = real_index[..., :, None] & real_index[..., None, :]
    hi = jnp.max(jnp.where(real, D, -jnp.inf), axis=(-2, -1), keepdims=True)
    lo = jnp.min(jnp.where(real, D, jnp.inf), axis=(-2, -1), keepdims=True)
    never = lo - (hi - lo + 1.0) * k
    return jnp.where(real, D, jnp.where(index[:, None] == index[None, :], hi, never))
