"""Adversarial Table Permutation by gradient (seed paper §3, Algorithm 1), with measured engineering options.

Per step and restart: D_r = pin_header(S(θ_r)), D_c = S(θ_c); hard orders P = Hungarian(D); the body is
the cells mixed by D laid out by P (soft embeddings, hard positions/mask); maximise
loss − λ_r H(D_r) − λ_c H(D_c) with Adam. All ``n_attack`` steps of all R restarts are one jitted
computation: ``lax.scan`` over steps inside ``vmap`` over restarts (one compile per shape bucket).

θ has the bucket's padded size; the real sizes are values. Sinkhorn holds the pads at the identity and the
Hungarian solves the real block only (``sinkhorn.hold_padding``, ``hungarian.project(size=…)``), so the
pads get no gradient and never move. Random draws do not depend on the padding: noise is drawn flat over
the padded size and read at ``i · n + j``, a start order is the argsort of random bits with the pads pushed
last (JAX's partitionable threefry gives element k the same value whatever the draw's total size), so a
padded run follows the unpadded run with the same seed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from atp_jax.attack.config import DIRECTIONS, AttackConfig
from atp_jax.attack.hungarian import perm_to_matrix, project
from atp_jax.attack.problem import ProblemTensors, answer_logits, objective_value, relaxed_positions, soft_body
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.attack.sinkhorn import SinkhornConfig, entropy, pin_header, sinkhorn
from atp_jax.models.modeling import Transformer
from atp_jax.sharding import place_batch

INITS = ("uniform", "identity", "random_perm")
POSITIONS = ("hard", "soft")
_INITS = {name: i for i, name in enumerate(INITS)}
_DIRECTIONS = {name: i for i, name in enumerate(DIRECTIONS)}


@dataclasses.dataclass(frozen=True)
class ATPConfig(AttackConfig):
    """Sinkhorn gradient ATP.

    n_attack: optimisation steps.
    lambda_row, lambda_col: entropy penalty weights; objective = loss − λ_r H(D_r) − λ_c H(D_c).
    lambda_schedule: ``constant`` or ``anneal`` (λ grows linearly from 0: soft early, sharp late).
    lr: Adam learning rate on θ.
    init: θ start: ``uniform`` (init_noise·N(0,1), D ≈ uniform), ``identity`` or ``random_perm``
      (init_scale·P0 + init_noise·N(0,1), D near that hard order).
    sinkhorn_iters, temperature: the Sinkhorn relaxation.
    restarts: R independent starts run as one vmapped computation.
    straight_through: forward with the hard permutation's embeddings, gradient through soft D.
    keep_best: return the best hard order seen during the run, not only the final projection.
    hungarian: ``host`` (SciPy through pure_callback) or ``device`` (optax).
    direction: ``gradient``; or a control: ``reversed`` (ascend −∇) or ``random`` (a random direction of
      the gradient's norm).
    positions: ``hard`` (the paper's: positions and mask of the hard order) or ``soft`` (each token's RoPE
      position follows the expected cell lengths under D, ``problem.soft_positions``, so the gradient sees the
      positions a reorder shifts; with ``straight_through`` the forward is still the hard order's exact one).
    """

    method: ClassVar[str] = "atp"
    choices: ClassVar[dict[str, tuple]] = {
        "init": INITS,
        "direction": DIRECTIONS,
        "hungarian": ("host", "device"),
        "lambda_schedule": ("constant", "anneal"),
        "positions": POSITIONS,
    }
    positive: ClassVar[tuple[str, ...]] = ("n_attack", "restarts")

    n_attack: int = 20
    lambda_row: float = 10.0
    lambda_col: float = 10.0
    lambda_schedule: str = "constant"
    lr: float = 0.1
    init: str = "uniform"
    init_scale: float = 3.0
    init_noise: float = 0.01
    sinkhorn_iters: int = 20
    temperature: float = 1.0
    restarts: int = 1
    straight_through: bool = False
    keep_best: bool = False
    hungarian: str = "host"
    direction: str = "gradient"
    positions: str = "hard"


def _settings(cfg: ATPConfig) -> dict:
    """The config fields that enter the computation as *values*, not as its structure: presets that differ
    only in these (mode, λ, lr, init, straight-through, which control, temperature) share one compile."""
    # numpy scalars, transferred as the program's arguments: jnp.asarray would compile a program to make each
    f32 = np.float32
    return {
        "rows_on": f32(cfg.mode in ("row", "joint")),
        "cols_on": f32(cfg.mode in ("col", "joint")),
        "lambda_row": f32(cfg.lambda_row),
        "lambda_col": f32(cfg.lambda_col),
        "anneal": f32(cfg.lambda_schedule == "anneal"),
        "lr": f32(cfg.lr),
        "init": np.int32(_INITS[cfg.init]),
        "init_scale": f32(cfg.init_scale),
        "init_noise": f32(cfg.init_noise),
        "temperature": f32(cfg.temperature),
        "straight_through": f32(cfg.straight_through),
        "direction": np.int32(_DIRECTIONS[cfg.direction]),
    }


def _padded_normal(key, k: int, size):
    """N(0, 1) draws ``[k, k]`` whose real block ``[:size, :size]`` does not depend on ``k`` (0 at the pads):
    element (i, j) is element ``i · size + j`` of one flat draw."""
    flat = jax.random.normal(key, (k * k,))
    i, j = jnp.arange(k)[:, None], jnp.arange(k)[None, :]
    real = (i < size) & (j < size)
    return jnp.where(real, flat[jnp.where(real, i * size + j, 0)], 0.0)


def _padded_permutation(key, k: int, size):
    """A uniformly random order of the first ``size`` of ``k`` entries, the pads fixed at the end: the argsort
    of random bits (the real ones do not depend on ``k``) with the pads' bits set to the maximum."""
    bits = jax.random.bits(key, (k,), jnp.uint32)
    keys = jnp.where(jnp.arange(k) < size, bits, jnp.asarray(jnp.iinfo(jnp.uint32).max, jnp.uint32))
    return jnp.argsort(keys, stable=True).astype(jnp.int32)


def _init_theta(key, k: int, size, s: dict):
    noise_key, perm_key = jax.random.split(key)
    noise = s["init_noise"] * _padded_normal(noise_key, k, size)
    start = jnp.where(s["init"] == _INITS["identity"], jnp.arange(k), _padded_permutation(perm_key, k, size))
    near_order = s["init_scale"] * perm_to_matrix(start) + noise
    return jnp.where(s["init"] == _INITS["uniform"], noise, near_order)


def _init_thetas(key, n: int, m: int, sizes, s: dict):
    """θ_row ``[n, n]`` and θ_col ``[m, m]``, drawn as one batch at the larger size and cut to each: a draw's real
    block does not depend on its padded size (``_padded_normal``, ``_padded_permutation``), so each θ is the one
    drawn alone at its own size, and the program holds one set of random-number kernels instead of two."""
    k = max(n, m)
    thetas = jax.vmap(lambda key, size: _init_theta(key, k, size, s))(jax.random.split(key), sizes)
    return {"row": thetas[0, :n, :n], "col": thetas[1, :m, :m]}


_INIT_SETTINGS = ("init", "init_scale", "init_noise")


@functools.partial(jax.jit, static_argnames=("n", "m"))
def _start_thetas(keys, n_rows, n_cols, s: dict, *, n: int, m: int):
    """Every restart's θ at step 0, ``{"row": [R, n, n], "col": [R, m, m]}``, from ``keys`` ``[R]``.

    A program of its own rather than part of ``_run_atp``: the random-number kernels (threefry, the normal's
    inverse error function, the start order's sort) are a quarter of that program's instructions, and here they
    depend on the padded table size and the restarts only, so every prompt-length bucket of one table size
    shares one compile, which the persistent cache keeps (``_run_atp``'s host callback keeps it out)."""
    sizes = jnp.stack([n_rows, n_cols])
    return jax.vmap(lambda key: _init_thetas(key, n, m, sizes, s))(keys)


def start_thetas(t: ProblemTensors, keys, cfg: ATPConfig) -> dict:
    """``_start_thetas`` for this problem's padded sizes (what ``_run_atp`` takes as ``thetas``)."""
    s = _settings(cfg)
    n, m = t.cell_embeds.shape[0] - 1, t.cell_embeds.shape[1]
    return _start_thetas(keys, t.n_rows, t.n_cols, {k: s[k] for k in _INIT_SETTINGS}, n=n, m=m)


def _steer(grads, direction, key, sizes):
    """A control for the gradient ``{"row": [n, n], "col": [m, m]}``: reversed (``direction`` 1), or a random
    direction of the same norm per matrix (2), drawn over each matrix's real block (``sizes``, the same tree as
    ``grads``); the gradient itself (0). The random draws are one batch at the larger size, cut to each."""
    names = sorted(grads)  # the order jax.tree.flatten gives, which the keys follow
    k = max(grads[name].shape[-1] for name in names)
    z = jax.vmap(lambda key, size: _padded_normal(key, k, size))(
        jax.random.split(key, len(names)), jnp.stack([sizes[name] for name in names])
    )
    steered = {}
    for z_i, name in zip(z, names):
        g = grads[name]
        z_i = z_i[: g.shape[-1], : g.shape[-1]]
        random = z_i * jnp.linalg.norm(g) / (jnp.linalg.norm(z_i) + 1e-12)
        steered[name] = jnp.select([direction == 1, direction == 2], [-g, random], g)
    return steered


def _relax(theta_row, theta_col, sizes, enabled, s: dict, sinkhorn_iters: int, hungarian: str):
    """(soft D, hard perm) of both dimensions, each the identity where the mode leaves it alone.

    ``theta_row [n, n]``, ``theta_col [m, m]``; ``sizes`` and ``enabled`` ``[2]`` (rows, columns): entries from
    the size on are padding (identity in D, fixed in perm). The two relaxations run as one: both matrices are
    padded to ``k = max(n, m)`` (identity, which Sinkhorn and the Hungarian hold in place) and stacked, so a
    step makes one Sinkhorn loop and one host Hungarian call rather than two of each — half the program to
    compile and half the device-to-host round trips.
    Returns ``(D_r [n, n], D_c [m, m], row_perm [n], col_perm [m])``.
    """
    n, m = theta_row.shape[-1], theta_col.shape[-1]
    k = max(n, m)
    theta = jnp.stack([jnp.pad(x, [(0, k - x.shape[-1])] * 2) for x in (theta_row, theta_col)])
    D = jax.vmap(lambda x, size: sinkhorn(x / s["temperature"], SinkhornConfig(sinkhorn_iters), size))(theta, sizes)
    perm = project(D, hungarian, sizes)
    D = jnp.where(enabled[:, None, None] > 0, D, jnp.eye(k))
    perm = jnp.where(enabled[:, None] > 0, perm, jnp.arange(k))
    return D[0, :n, :n], D[1, :m, :m], perm[0, :n], perm[1, :m]


def run_atp(model: Transformer, t: ProblemTensors, keys, cfg: ATPConfig):
    """All restarts of one ATP run. ``keys`` ``[R]``.

    Returns (trace, final_row_perms ``[R, N1-1]``, final_col_perms ``[R, M]``), orders padded to the bucket
    (the pads fixed: the real orders are the first n / m entries); trace fields are ``[R, n_attack, ...]``:
    objective, loss (CE/KL of the forward actually run), entropies, and the hard orders used at each step.
    One compile per shape bucket, step count, Sinkhorn sweeps, objective, Hungarian backend, positions and
    whether the direction is a control; every other setting is a value (see ``_settings``).
    """
    return _run_atp(model, t, keys, start_thetas(t, keys, cfg), _settings(cfg), **_static(cfg))


def lower_atp(model: Transformer, t: ProblemTensors, keys, cfg: ATPConfig, fresh: bool = False):
    """``run_atp``'s optimisation program for these shapes, lowered (``.compile()`` it; its ``memory_analysis()``
    sizes a step); the start θ's small program (``_start_thetas``) is run, not lowered. ``fresh`` drops the
    programs already traced, so that lowering and compiling are done anew (for timing)."""
    if fresh:
        _run_atp.clear_cache()
    return _run_atp.lower(model, t, keys, start_thetas(t, keys, cfg), _settings(cfg), **_static(cfg))


def _static(cfg: ATPConfig) -> dict:
    """The config fields that shape the computation (each value its own compile). ``positions`` is one of them
    because soft positions add a large subprogram (and its gradient) that hard-position runs need not compile;
    ``steer`` because the controls' steering (random draws every step) is a subprogram the attack itself need
    not compile — the reversed and random controls share one program, the gradient's presets another."""
    return {
        "n_attack": cfg.n_attack,
        "sinkhorn_iters": cfg.sinkhorn_iters,
        "objective": cfg.objective,
        "hungarian": cfg.hungarian,
        "positions": cfg.positions,
        "steer": cfg.direction != "gradient",
    }


_STATIC_FIELDS = tuple(_static(ATPConfig()))


@functools.partial(jax.jit, static_argnames=_STATIC_FIELDS)
def _run_atp(
    model: Transformer,
    t: ProblemTensors,
    keys,
    thetas: dict,
    s: dict,
    *,
    n_attack: int,
    sinkhorn_iters: int,
    objective: str,
    hungarian: str,
    positions: str,
    steer: bool,
):
    sizes = {"row": t.n_rows, "col": t.n_cols}  # real sizes; the arrays have the bucket's
    optimizer = optax.adam(s["lr"])
    relaxed_sizes, relaxed_on = jnp.stack([t.n_rows, t.n_cols]), jnp.stack([s["rows_on"], s["cols_on"]])

    def relax(params):
        return _relax(params["row"], params["col"], relaxed_sizes, relaxed_on, s, sinkhorn_iters, hungarian)

    def objective_fn(params, step):
        D_r, D_c, row_perm, col_perm = relax(params)
        # Straight-through: the forward uses the hard orders, the gradient flows through the soft D.
        used_r = D_r + s["straight_through"] * jax.lax.stop_gradient(perm_to_matrix(row_perm) - D_r)
        used_c = D_c + s["straight_through"] * jax.lax.stop_gradient(perm_to_matrix(col_perm) - D_c)
        body = soft_body(t, pin_header(used_r), used_c, row_perm, col_perm)
        ids = relaxed_positions(t, pin_header(used_r), used_c, row_perm, col_perm, positions == "soft")
        loss = objective_value(t, answer_logits(model, t, body[None], ids[None]), objective)[0]
        h_r, h_c = entropy(D_r), entropy(D_c)
        weight = jnp.where(s["anneal"] > 0, step / max(n_attack - 1, 1), 1.0)
        value = loss - weight * (s["lambda_row"] * h_r * s["rows_on"] + s["lambda_col"] * h_c * s["cols_on"])
        aux = {"loss": loss, "entropy_row": h_r, "entropy_col": h_c, "row_perm": row_perm, "col_perm": col_perm}
        return value, aux

    def one_restart(key, params):
        def step(carry, i):
            params, opt_state = carry
            (value, aux), grads = jax.value_and_grad(objective_fn, has_aux=True)(params, i)
            if steer:
                grads = _steer(grads, s["direction"], jax.random.fold_in(key, i), sizes)
            ascent = jax.tree.map(jnp.negative, grads)  # optax minimises; we maximise the objective
            updates, opt_state = optimizer.update(ascent, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), {**aux, "objective": value}

        (params, _), trace = jax.lax.scan(step, (params, optimizer.init(params)), jnp.arange(n_attack))
        _, _, final_r, final_c = relax(params)
        return trace, final_r, final_c

    return jax.vmap(one_restart)(keys, thetas)


def atp_attack(evaluator: Evaluator, cfg: ATPConfig, rng: np.random.Generator | None = None) -> AttackResult:
    """Runs ATP and chooses among the restarts' orders by the true (re-rendered) objective.

    ``rng`` is unused: the JAX key derives from ``cfg.seed``."""
    del rng
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.restarts)
    keys = place_batch(keys, evaluator.loaded.mesh)  # restarts split over the mesh's data axis
    thetas = start_thetas(evaluator.problem.tensors, keys, cfg)
    trace, final_r, final_c = evaluator.compute(_run_atp, keys, thetas, _settings(cfg), **_static(cfg))
    trace = jax.tree.map(np.asarray, trace)
    n, m = evaluator.problem.n_rows, evaluator.problem.n_cols  # the real orders: the pads come after them
    trace["row_perm"], trace["col_perm"] = trace["row_perm"][..., :n], trace["col_perm"][..., :m]
    final_r, final_c = np.asarray(final_r)[:, :n], np.asarray(final_c)[:, :m]
    R, steps = cfg.restarts, cfg.n_attack
    evaluator.queries += R * steps
    evaluator.backward_calls += R * steps

    finals = [(tuple(map(int, r)), tuple(map(int, c))) for r, c in zip(final_r, final_c)]
    visited = [
        (tuple(map(int, r)), tuple(map(int, c)))
        for r, c in zip(trace["row_perm"].reshape(R * steps, -1), trace["col_perm"].reshape(R * steps, -1))
    ]
    scored: dict[tuple, float] = {}
    if cfg.keep_best:
        if cfg.straight_through and evaluator.problem.layout.exact:
            # The traced loss is the hard order's own loss, equal to the re-rendered text's: known for free.
            scored = {order: float(loss) for order, loss in zip(visited, trace["loss"].reshape(-1))}
        else:  # soft forwards say nothing exact about the hard orders: score the distinct ones visited
            distinct = sorted(set(visited))
            scored = dict(
                zip(distinct, map(float, evaluator.losses([o[0] for o in distinct], [o[1] for o in distinct])))
            )
    unscored = sorted(set(finals) - set(scored))
    if unscored and (scored or len(unscored) > 1):  # a choice to make: score the restarts' final orders
        if evaluator.problem.layout.exact:
            values = evaluator.losses([o[0] for o in unscored], [o[1] for o in unscored])
        else:  # per-cell tokens differ from the text's: choose by the re-rendered text itself
            values = evaluator.true_losses([o[0] for o in unscored], [o[1] for o in unscored])
            evaluator.queries += len(unscored)
        scored.update(zip(unscored, map(float, values)))
    chosen = max(scored, key=scored.get) if scored else finals[0]
    summary = {
        "objective": trace["objective"].tolist(),
        "loss": trace["loss"].tolist(),
        "entropy_row": trace["entropy_row"].tolist(),
        "entropy_col": trace["entropy_col"].tolist(),
        "distinct_orders_visited": len(set(visited)),
    }
    return evaluator.result(cfg.method, np.array(chosen[0]), np.array(chosen[1]), summary)
