"""One training step as a pure jitted function: the reference answers' cross-entropy, its gradient, AdamW.

What is trained (``params``) is a pure dict of arrays, never the module itself:

* a full fine-tune (``TrainStepConfig.lora`` None; what a 135M model takes): every parameter of the model,
  ``nnx.to_pure_dict(nnx.state(model))`` (``{"embed_tokens", "layers": {...}, "final_norm", …}``);
* LoRA (``lora`` set; for 0.5B and up): the adapters of ``atp_jax.train.lora`` only, the model's own weights
  frozen.

The module enters ``train_step`` as a jit argument (NNX modules are pytrees), so new weight values reuse the
compiled program; ``trained_model`` builds, inside the trace, the module that runs on ``params``.

The batch is right-padded token ids ``[B, S]`` with, per row, the positions whose logits predict the answer
tokens ``[B, A]``, those tokens and a mask of the real ones, and a mask of the real rows ``[B]`` (rows that only
pad the batch to its shape count zero). Causal attention makes the padding after each answer inert, as in
``atp_jax.inference.qa.token_nll``. The loss is the mean over real rows of each row's mean token CE, so a long
answer weighs as much as a short one, as in the attack's objective.

Data parallel: with the batch split over a mesh's ``data`` axis (``place``) and the parameters replicated along
it, ``jit`` inserts the gradient's all-reduce; the step computes what one device computes, to float rounding.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from atp_jax.models.modeling import Transformer
from atp_jax.sharding import place_batch
from atp_jax.train.lora import LoraConfig, init_lora, merge

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class TrainStepConfig:
    """The optimizer and what it trains. Its numbers enter the compiled step as values (``settings``), ``lora`` as
    its structure (a static argument), so only another adapter shape compiles another step.

    learning_rate: AdamW's peak learning rate.
    warmup_steps: the rate climbs linearly to its peak over this many steps (step ``k < W`` uses ``(k+1)/W`` of
      it), then holds (``constant``) or decays to 0 at ``total_steps`` along a half cosine (``cosine``).
    weight_decay: AdamW's decoupled decay, on kernels, embeddings and adapters (never norms or biases).
    grad_clip: the gradient's global norm is clipped to this before AdamW; 0 leaves it unclipped.
    lora: train low-rank adapters of the frozen model (``atp_jax.train.lora``); None: every parameter.
    """

    learning_rate: float = 1e-5
    warmup_steps: int = 0
    schedule: str = "constant"
    total_steps: int = 1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lora: LoraConfig | None = None

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate}; it must be > 0")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(
                f"warmup_steps={self.warmup_steps}, weight_decay={self.weight_decay}, grad_clip={self.grad_clip}: "
                "none may be negative"
            )
        if self.total_steps < 1:
            raise ValueError(f"total_steps={self.total_steps}; it must be >= 1")


class Batch(NamedTuple):
    """One padded training batch (a pytree of arrays).

    ids: ``[B, S]`` int32, each row its prompt then its reference answer, right-padded with any id.
    target_positions: ``[B, A]`` int32, the indices into S whose logits predict ``targets``.
    targets: ``[B, A]`` int32 answer token ids.
    target_mask: ``[B, A]`` float32, 1 at real answer tokens, 0 at answer slots that pad A.
    example_mask: ``[B]`` float32, 1 for real rows, 0 for rows that pad B.
    """

    ids: jax.Array
    target_positions: jax.Array
    targets: jax.Array
    target_mask: jax.Array
    example_mask: jax.Array


def place(batch: Batch, mesh) -> Batch:
    """The batch on ``mesh`` split over its ``data`` axis (where B divides evenly), or on the default device."""
    return Batch(*(place_batch(np.asarray(x), mesh) for x in batch))


def settings(config: TrainStepConfig) -> dict[str, jax.Array]:
    """The optimizer's numbers as arrays: they enter ``train_step`` as values, not as its structure, so runs that
    differ only in them (another learning rate, schedule or clip) share one compiled step. numpy scalars: ``jit``
    transfers them, where ``jnp.asarray`` would run (and first compile) a program for each, every step."""
    f32 = np.float32
    return {
        "learning_rate": f32(config.learning_rate),
        "warmup_steps": f32(config.warmup_steps),
        "cosine": f32(config.schedule == "cosine"),
        "total_steps": f32(config.total_steps),
        "weight_decay": f32(config.weight_decay),
        "grad_clip": f32(config.grad_clip if config.grad_clip > 0 else np.inf),
    }


def learning_rate(values: dict, count):
    """The learning rate of the update with index ``count`` (0 for the first; traced or not) under ``settings``."""
    count = jnp.asarray(count, jnp.float32)
    ramp = jnp.minimum(1.0, (count + 1.0) / jnp.maximum(values["warmup_steps"], 1.0))
    span = jnp.maximum(values["total_steps"] - values["warmup_steps"], 1.0)
    progress = jnp.clip((count - values["warmup_steps"]) / span, 0.0, 1.0)
    decay = jnp.where(values["cosine"] > 0, 0.5 * (1.0 + jnp.cos(jnp.pi * progress)), 1.0)
    return values["learning_rate"] * ramp * decay


def _decays(params) -> dict:
    """True for the leaves weight decay applies to: all but norms and biases (decaying a norm's gain towards 0
    would shrink the layer's output rather than regularise it)."""

    def decays(path, _):
        name = str(getattr(path[-1], "key", path[-1]))
        return not (name.endswith("norm") or name.endswith("bias"))

    return jax.tree_util.tree_map_with_path(decays, params)


def optimizer(values: dict) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on ``learning_rate``'s schedule, for ``settings(config)`` (arrays or
    tracers: the structure of the optimizer and its state does not depend on them)."""
    return optax.chain(
        optax.clip_by_global_norm(values["grad_clip"]),
        optax.adamw(functools.partial(learning_rate, values), weight_decay=values["weight_decay"], mask=_decays),
    )


def with_weights(model: Transformer, weights: dict) -> Transformer:
    """A module like ``model`` whose parameters are those of ``weights`` (a pure dict of all of them, or of some:
    ``{"layers": {"q_proj": …}}``), the others shared with ``model``; ``model`` itself is unchanged. Works inside
    a trace (the module is then the traced argument's copy) and outside."""
    graphdef, state = nnx.split(model)
    nnx.replace_by_pure_dict(state, _overlay(nnx.to_pure_dict(state), weights))
    return nnx.merge(graphdef, state)


def _overlay(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _overlay(base[key], value) if isinstance(value, dict) else value
    return out


def init_params(model: Transformer, config: TrainStepConfig, key: jax.Array) -> dict:
    """The trainable parameters at the start: the model's own (full fine-tune) or fresh adapters (LoRA), the
    latter replicated over the model's mesh (they are small; every device applies them to its shard)."""
    if config.lora is None:
        return nnx.to_pure_dict(nnx.state(model))
    lora = init_lora(model.layers.weights(), config.lora, key)
    if model.mesh is not None:
        lora = jax.device_put(lora, NamedSharding(model.mesh, PartitionSpec()))
    return lora


def init_optimizer(params: dict, config: TrainStepConfig):
    """The optimizer state for ``params``, each of its copies of the parameter tree (Adam's moments) placed as
    ``params`` are and its counters replicated: the placement ``train_step`` returns it in, so the step's second
    call reuses the first call's program."""
    init = optimizer(settings(config)).init
    mesh = next(
        (leaf.sharding.mesh for leaf in jax.tree.leaves(params) if isinstance(leaf.sharding, NamedSharding)), None
    )
    if mesh is None:
        return jax.jit(init)(params)
    # Zeros depend on no input, so jit alone would put them on one device.
    shardings = optax.tree_utils.tree_map_params(
        init,
        lambda _, param: param.sharding,
        jax.eval_shape(init, params),
        params,
        transform_non_params=lambda _: NamedSharding(mesh, PartitionSpec()),
    )
    return jax.jit(init, out_shardings=shardings)(params)


def trained_model(model: Transformer, params: dict, config: TrainStepConfig) -> Transformer:
    """The module that runs on ``params``: ``model`` with its weights replaced (full) or its targeted kernels
    merged with the adapters (LoRA). Pure: jittable, and ``model`` is left as it was."""
    if config.lora is None:
        return with_weights(model, params)
    return with_weights(model, {"layers": merge(model.layers.weights(), params, config.lora)})


def example_losses(model: Transformer, batch: Batch):
    """Each row's mean token cross-entropy of its answer ``[B]`` float32 (0 for a row without answer tokens)."""
    B, S = batch.ids.shape
    out = model(
        model.embed(batch.ids),
        jnp.broadcast_to(jnp.arange(S), (B, S)),
        jnp.ones((B, S), bool),
        logits_positions=batch.target_positions,
    )
    logp = jax.nn.log_softmax(out.logits, axis=-1)
    nll = -jnp.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]  # [B, A]
    mask = batch.target_mask.astype(jnp.float32)
    return (nll * mask).sum(axis=1) / jnp.maximum(mask.sum(axis=1), 1.0)


def batch_loss(params: dict, model: Transformer, batch: Batch, config: TrainStepConfig):
    """The mean over real rows of ``example_losses`` under ``params`` (scalar float32)."""
    losses = example_losses(trained_model(model, params, config), batch)
    weights = batch.example_mask.astype(jnp.float32)
    return (losses * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def train_step(model: Transformer, params: dict, opt_state, batch: Batch, config: TrainStepConfig):
    """One AdamW step on ``batch``.

    Args:
      model: the module (full fine-tune: its weights are replaced by ``params``; LoRA: the frozen base).
      params: the trainable pure dict (``init_params``).
      opt_state: ``init_optimizer``'s state for ``params``.
      batch: a ``Batch`` (``[B, S]`` ids, ``[B, A]`` targets, ``[B]`` row mask).
      config: the ``TrainStepConfig``; its numbers are passed as values (``settings``), its LoRA as structure.

    Returns:
      ``(params, opt_state, loss, grad_norm)``: the updated parameters and state, the batch's loss before the
      update and the gradient's global norm before clipping (float32 scalars). A non-finite loss or norm is the
      caller's to catch: the returned parameters are then not to be kept.
    """
    placement = _placement((params, opt_state))
    if placement is not None:  # one spelling of each placement in, the same out (no copy: the same layout)
        params, opt_state = jax.device_put((params, opt_state), jax.tree.unflatten(*placement))
    return _train_step(model, params, opt_state, batch, settings(config), config.lora, placement)


def _placement(tree):
    """``(treedef, shardings)`` of a tree living on a mesh (hashable: a static argument), or None."""
    leaves, treedef = jax.tree.flatten(tree)
    shardings = tuple(_canonical(getattr(leaf, "sharding", None)) for leaf in leaves)
    return (treedef, shardings) if any(isinstance(s, NamedSharding) for s in shardings) else None


def _canonical(sharding):
    """``P(None, "model", None)`` as ``P(None, "model")``: the same placement, in the form jit returns it. Arrays
    placed alike but spelled differently would make jit trace and compile the step again."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)


@functools.partial(jax.jit, static_argnames=("lora", "placement"))
def _train_step(model: Transformer, params: dict, opt_state, batch: Batch, values: dict, lora, placement):
    config = TrainStepConfig(lora=lora)  # the structure; the numbers are ``values``
    loss, grads = jax.value_and_grad(batch_loss)(params, model, batch, config)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = optimizer(values).update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    if placement is not None:
        # The new state placed as the old one: otherwise XLA may choose another layout for it, and the next step,
        # given arrays placed differently, would compile again.
        treedef, shardings = placement
        params, opt_state = jax.lax.with_sharding_constraint(
            (params, opt_state), jax.tree.unflatten(treedef, shardings)
        )
    return params, opt_state, loss, grad_norm
