"""Tests for atp_jax.attack.hungarian against brute force over all permutations."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from atp_jax.attack.hungarian import perm_to_matrix, project
from atp_jax.attack.sinkhorn import sinkhorn

METHODS = ["host", "device"]
# Shared across tests so that equal shapes compile once (tests stay fast).
_VMAPPED = {m: jax.jit(jax.vmap(functools.partial(project, method=m))) for m in METHODS}


def _brute_force(D):
    """[..., k, k] -> (best perm [..., k], best score [...], runner-up gap [...]) by enumeration."""
    D = np.asarray(D, np.float64)
    k = D.shape[-1]
    perms = np.array(list(itertools.permutations(range(k))))  # [k!, k]
    flat = D.reshape(-1, k, k)
    scores = flat[:, np.arange(k)[None, :], perms].sum(-1)  # [B, k!]: sum_a D[a, perm[a]]
    order = np.argsort(-scores, axis=-1)
    best = perms[order[:, 0]]
    top = np.take_along_axis(scores, order[:, :2], axis=-1)
    lead = D.shape[:-2]
    return best.reshape(lead + (k,)), top[:, 0].reshape(lead), (top[:, 0] - top[:, 1]).reshape(lead)


def _score(D, perm):
    D = np.asarray(D, np.float64)
    return np.take_along_axis(D, np.asarray(perm)[..., None], axis=-1)[..., 0].sum(-1)


def _cases_5x5(n=50):
    """Half raw uniform scores, half Sinkhorn outputs at several sharpnesses (what the attack feeds)."""
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    raw = jax.random.uniform(key_a, (n // 2, 5, 5))
    scales = jnp.repeat(jnp.asarray([0.5, 2.0, 8.0]), (n - n // 2) // 3 + 1)[: n - n // 2]
    soft = sinkhorn(scales[:, None, None] * jax.random.normal(key_b, (n - n // 2, 5, 5)))
    return np.concatenate([np.asarray(raw), np.asarray(soft)])


def _check_against_brute_force(D, perm):
    perm = np.asarray(perm)
    k = D.shape[-1]
    assert perm.dtype == np.int32 and perm.shape == D.shape[:-1]
    np.testing.assert_array_equal(np.sort(perm, axis=-1), np.broadcast_to(np.arange(k), perm.shape))
    best, best_score, gap = _brute_force(D)
    np.testing.assert_allclose(_score(D, perm), best_score, rtol=0, atol=1e-6)
    unique = gap > 1e-5  # on (near-)ties any optimal permutation is acceptable
    assert unique.mean() > 0.9  # the random cases are not degenerate
    np.testing.assert_array_equal(perm[unique], best[unique])


@pytest.mark.parametrize("method", METHODS)
def test_jit_vmap_matches_brute_force_5x5(method):
    D = _cases_5x5(50)
    _check_against_brute_force(D, _VMAPPED[method](jnp.asarray(D)))


@pytest.mark.parametrize("method", METHODS)
def test_leading_batch_dims_2_3_4_4(method):
    D = np.asarray(jax.random.uniform(jax.random.PRNGKey(1), (2, 3, 4, 4)))
    f = functools.partial(project, method=method)
    direct = jax.jit(f)(jnp.asarray(D))  # leading dims handled without vmap
    nested = jax.jit(jax.vmap(jax.vmap(f)))(jnp.asarray(D))  # and under nested vmap
    mixed = _VMAPPED[method](jnp.asarray(D))  # vmap over one axis, one leading dim left inside
    for perm in (direct, nested, mixed):
        _check_against_brute_force(D, perm)


def test_host_and_device_agree_on_larger_k():
    # Brute force is out of reach at k = 12; the two independent solvers must reach the same optimum.
    D = sinkhorn(3.0 * jax.random.normal(jax.random.PRNGKey(2), (8, 12, 12)))
    host = np.asarray(_VMAPPED["host"](D))
    dev = np.asarray(_VMAPPED["device"](D))
    np.testing.assert_allclose(_score(D, host), _score(D, dev), atol=1e-5)


def test_host_callback_receives_whole_batch_once(host_assign_calls):
    calls = host_assign_calls
    f = functools.partial(project, method="host")

    D = jnp.asarray(_cases_5x5(16))
    fn = jax.jit(jax.vmap(f))  # a fresh jit, so it traces with the patched callback
    fn(D).block_until_ready()
    assert calls == [(16, 5, 5)]
    fn(D).block_until_ready()  # a second call of the compiled function: one more callback, same shape
    assert calls == [(16, 5, 5)] * 2

    calls.clear()
    D4 = jax.random.uniform(jax.random.PRNGKey(3), (2, 3, 4, 4))
    jax.jit(jax.vmap(jax.vmap(f)))(D4).block_until_ready()
    assert calls == [(2, 3, 4, 4)]


def test_perm_to_matrix():
    perm = jnp.asarray([[2, 0, 1], [0, 1, 2]], jnp.int32)
    P = np.asarray(perm_to_matrix(perm))
    expected = np.zeros((2, 3, 3))
    for b in range(2):
        for a in range(3):
            expected[b, a, int(perm[b, a])] = 1.0
    np.testing.assert_array_equal(P, expected)
    # <P, D> is the assignment score the projection maximises.
    D = np.asarray(jax.random.uniform(jax.random.PRNGKey(4), (2, 3, 3)))
    np.testing.assert_allclose((P * D).sum((-2, -1)), _score(D, perm), rtol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_recovers_the_permutation_sinkhorn_was_built_from(method):
    rng = np.random.default_rng(5)
    perms = np.stack([rng.permutation(6) for _ in range(10)])
    D = sinkhorn(jnp.asarray(4.0 * np.eye(6)[perms]) + jax.random.normal(jax.random.PRNGKey(5), (10, 6, 6)))
    np.testing.assert_array_equal(np.asarray(_VMAPPED[method](D)), perms)


@pytest.mark.parametrize("method", METHODS)
def test_straight_through_gradient_and_no_gradient_into_projection(method):
    theta = jax.random.normal(jax.random.PRNGKey(6), (3, 5, 5))
    W = jax.random.normal(jax.random.PRNGKey(7), (3, 5, 5))

    def loss(t):
        D = sinkhorn(t)
        P = perm_to_matrix(project(D, method=method))
        D_st = D + jax.lax.stop_gradient(P - D)  # value of P, gradient of D
        return jnp.sum(D_st * W)

    g = jax.jit(jax.grad(loss))(theta)
    g_soft = jax.grad(lambda t: jnp.sum(sinkhorn(t) * W))(theta)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_soft), atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_non_finite_and_low_precision_inputs_give_valid_permutations(method):
    D = np.array(jax.random.uniform(jax.random.PRNGKey(8), (4, 5, 5)))
    D[0, 1, 2] = np.nan
    D[1, 3, :] = np.inf
    D[2, :, 0] = -np.inf
    D[3] = np.nan
    perm = np.asarray(jax.jit(functools.partial(project, method=method))(jnp.asarray(D)))
    np.testing.assert_array_equal(np.sort(perm, -1), np.broadcast_to(np.arange(5), perm.shape))
    # Clamping is order-preserving on the finite entries, so the finite problem's optimum is kept:
    # D[0] with the NaN as "never pick" is solved exactly.
    D0 = D[0].copy()
    D0[1, 2] = -1e6
    np.testing.assert_array_equal(perm[0], _brute_force(D0)[0])

    Db = jax.random.uniform(jax.random.PRNGKey(9), (6, 5, 5)).astype(jnp.bfloat16)
    out = _VMAPPED[method](Db)
    np.testing.assert_allclose(
        _score(np.asarray(Db.astype(jnp.float32)), out), _brute_force(np.asarray(Db.astype(jnp.float32)))[1], atol=1e-6
    )


def test_unknown_method_rejected():
    with pytest.raises(ValueError):
        project(jnp.eye(3), method="gpu")
