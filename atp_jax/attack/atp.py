"""Adversarial Table Permutation by gradient (seed paper §3, Algorithm 1), with measured engineering options.

Per step and restart: D_r = pin_header(S(θ_r)), D_c = S(θ_c); hard orders P = Hungarian(D); the body is
the cells mixed by D laid out by P (soft embeddings, hard positions/mask); maximise
loss − λ_r H(D_r) − λ_c H(D_c) with Adam. All ``n_attack`` steps of all R restarts are one jitted
computation: ``lax.scan`` over steps inside ``vmap`` over restarts (one compile per table).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from atp_jax.attack.config import ATPConfig
from atp_jax.attack.hungarian import perm_to_matrix, project
from atp_jax.attack.problem import ProblemTensors, answer_logits, objective_value, soft_body
from atp_jax.attack.result import AttackResult, Evaluator
from atp_jax.attack.sinkhorn import SinkhornConfig, entropy, pin_header, sinkhorn
from atp_jax.models.modeling import Transformer


def _init_theta(key, k: int, cfg: ATPConfig):
    noise_key, perm_key = jax.random.split(key)
    noise = cfg.init_noise * jax.random.normal(noise_key, (k, k))
    if cfg.init == "uniform":
        return noise
    start = jnp.arange(k) if cfg.init == "identity" else jax.random.permutation(perm_key, k)
    return cfg.init_scale * perm_to_matrix(start) + noise


def _steer(grads, direction: str, key):
    """The gradient itself, or a control: reversed, or a random direction of the same norm per matrix."""
    if direction == "gradient":
        return grads
    if direction == "reversed":
        return jax.tree.map(jnp.negative, grads)
    leaves, treedef = jax.tree.flatten(grads)
    keys = jax.random.split(key, len(leaves))
    noise = [jax.random.normal(k, g.shape) for k, g in zip(keys, leaves)]
    scaled = [z * jnp.linalg.norm(g) / (jnp.linalg.norm(z) + 1e-12) for z, g in zip(noise, leaves)]
    return jax.tree.unflatten(treedef, scaled)


def _relax(theta, enabled: bool, cfg: ATPConfig):
    """(soft D, hard perm) of one dimension, or the identity when the mode leaves it alone."""
    k = theta.shape[-1]
    if not enabled:
        return jnp.eye(k), jnp.arange(k)
    D = sinkhorn(theta, SinkhornConfig(cfg.sinkhorn_iters, cfg.temperature))
    return D, project(D, cfg.hungarian)


@functools.partial(jax.jit, static_argnames=("cfg",))
def run_atp(model: Transformer, t: ProblemTensors, keys, cfg: ATPConfig):
    """All restarts of one ATP run. ``keys`` ``[R, 2]``.

    Returns (trace, final_row_perms ``[R, n]``, final_col_perms ``[R, m]``); trace fields are
    ``[R, n_attack, ...]``: objective, loss (CE/KL of the forward actually run), entropies, and the hard
    orders used at each step.
    """
    n, m = t.cell_embeds.shape[0] - 1, t.cell_embeds.shape[1]
    rows_on, cols_on = cfg.mode in ("row", "joint"), cfg.mode in ("col", "joint")
    optimizer = optax.adam(cfg.lr)

    def objective(params, step):
        D_r, row_perm = _relax(params["row"], rows_on, cfg)
        D_c, col_perm = _relax(params["col"], cols_on, cfg)
        used_r, used_c = D_r, D_c
        if cfg.straight_through:  # hard forward, soft backward
            used_r = D_r + jax.lax.stop_gradient(perm_to_matrix(row_perm) - D_r)
            used_c = D_c + jax.lax.stop_gradient(perm_to_matrix(col_perm) - D_c)
        body = soft_body(t, pin_header(used_r), used_c, row_perm, col_perm)
        loss = objective_value(t, answer_logits(model, t, body[None]), cfg.objective)[0]
        h_r, h_c = entropy(D_r), entropy(D_c)
        weight = 1.0 if cfg.lambda_schedule == "constant" else step / max(cfg.n_attack - 1, 1)
        value = loss - weight * (cfg.lambda_row * h_r * rows_on + cfg.lambda_col * h_c * cols_on)
        aux = {"loss": loss, "entropy_row": h_r, "entropy_col": h_c, "row_perm": row_perm, "col_perm": col_perm}
        return value, aux

    def one_restart(key):
        row_key, col_key = jax.random.split(key)
        params = {"row": _init_theta(row_key, n, cfg), "col": _init_theta(col_key, m, cfg)}

        def step(carry, i):
            params, opt_state = carry
            (value, aux), grads = jax.value_and_grad(objective, has_aux=True)(params, i)
            grads = _steer(grads, cfg.direction, jax.random.fold_in(key, i))
            ascent = jax.tree.map(jnp.negative, grads)  # optax minimises; we maximise the objective
            updates, opt_state = optimizer.update(ascent, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), {**aux, "objective": value}

        (params, _), trace = jax.lax.scan(step, (params, optimizer.init(params)), jnp.arange(cfg.n_attack))
        _, final_r = _relax(params["row"], rows_on, cfg)
        _, final_c = _relax(params["col"], cols_on, cfg)
        return trace, final_r, final_c

    return jax.vmap(one_restart)(keys)


def atp_attack(evaluator: Evaluator, cfg: ATPConfig, name: str = "atp") -> AttackResult:
    """Runs ATP and chooses among the restarts' orders by the true (re-rendered) objective."""
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.restarts)
    trace, final_r, final_c = run_atp(evaluator.loaded.model, evaluator.problem.tensors, keys, cfg)
    trace = jax.tree.map(np.asarray, trace)
    R, steps = cfg.restarts, cfg.n_attack
    evaluator.forward_calls += R * steps
    evaluator.backward_calls += R * steps

    finals = [(tuple(map(int, r)), tuple(map(int, c))) for r, c in zip(np.asarray(final_r), np.asarray(final_c))]
    visited = [(tuple(map(int, r)), tuple(map(int, c))) for r, c in zip(trace["row_perm"].reshape(R * steps, -1),
                                                                         trace["col_perm"].reshape(R * steps, -1))]
    scored: dict[tuple, float] = {}
    if cfg.keep_best:
        if cfg.straight_through and evaluator.problem.layout.exact:
            # The traced loss is the hard order's own loss, equal to the re-rendered text's: known for free.
            scored = {order: float(loss) for order, loss in zip(visited, trace["loss"].reshape(-1))}
        else:  # soft forwards say nothing exact about the hard orders: score the distinct ones visited
            distinct = sorted(set(visited))
            scored = dict(zip(distinct, map(float, evaluator.losses([o[0] for o in distinct], [o[1] for o in distinct]))))
    unscored = sorted(set(finals) - set(scored))
    if unscored and (scored or len(unscored) > 1):  # a choice to make: score the restarts' final orders
        if evaluator.problem.layout.exact:
            values = evaluator.losses([o[0] for o in unscored], [o[1] for o in unscored])
        else:  # per-cell tokens differ from the text's: choose by the re-rendered text itself
            values = evaluator.true_losses([o[0] for o in unscored], [o[1] for o in unscored])
            evaluator.forward_calls += len(unscored)
        scored.update(zip(unscored, map(float, values)))
    chosen = max(scored, key=scored.get) if scored else finals[0]
    summary = {
        "objective": trace["objective"].tolist(),
        "loss": trace["loss"].tolist(),
        "entropy_row": trace["entropy_row"].tolist(),
        "entropy_col": trace["entropy_col"].tolist(),
        "distinct_orders_visited": len(set(visited)),
    }
    return evaluator.result(name, np.array(chosen[0]), np.array(chosen[1]), summary)
