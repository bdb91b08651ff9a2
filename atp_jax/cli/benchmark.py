"""Where the time goes: model load, forward and forward+backward to the input embeddings, the same in
transformers' PyTorch model, matmul throughput, ATP steps, what ATP's program takes to compile, one whole
attack, and one training step of ``atp_jax.train`` with and without its inner attack.

Variants run in one process, alternating round by round so machine drift hits all alike; each figure
is the median of ``--repeats`` runs after a warm-up call, whose time (compile included) is reported
separately.

  atp-benchmark --model smollm2-135m-instruct --tokens 256
  atp-benchmark --model qwen2.5-coder-1.5b-instruct --repeats 3
  atp-benchmark --model config:llama-3.1-8b --dtype bfloat16 --variants fwd,fwd_bwd,matmul_peak
  atp-benchmark --model smollm2-135m-instruct --variants atp_compile --attack_preset atp_joint
  atp-benchmark --model smollm2-135m-instruct --variants train_step,adversarial_train_step --train_batch 8
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import resource
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from flax import nnx

import atp_jax
from atp_jax.cli import model_flags
from atp_jax.cli.console import run_app
from atp_jax.models.architectures import parameter_counts
from atp_jax.models.params import export_hf
from atp_jax.sharding import describe, device_bytes, place_batch

# Each name selects a group of timed runs (``matmul_peak`` times two sizes, ``atp_steps`` seven runs).
VARIANTS = (
    "fwd",
    "fwd_bwd",
    "torch_fwd_bwd",
    "torch_compile_fwd_bwd",
    "matmul_peak",
    "atp_step",
    "atp_steps",
    "atp_compile",
    "attack_example",
    "train_step",
    "adversarial_train_step",
)
TORCH_VARIANTS = ("torch_fwd_bwd", "torch_compile_fwd_bwd")
ATTACK_VARIANTS = ("atp_step", "atp_steps", "atp_compile", "attack_example")
TRAIN_VARIANTS = ("train_step", "adversarial_train_step")
TEXT_VARIANTS = ATTACK_VARIANTS + TRAIN_VARIANTS  # these build a text prompt: they need a tokenizer
MATMUL_SIZES = (2048, 4096)

model_flags.define_model_flags(atp_jax.DEFAULT_MODEL)
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), f"Variants to run: {', '.join(VARIANTS)}.")
_TOKENS = flags.DEFINE_integer("tokens", 256, "Prompt length.")
_ANSWER_TOKENS = flags.DEFINE_integer("answer_tokens", 8, "Positions that get logits / loss.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per variant (median reported).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the figures as JSON here.")
_ATTACK = flags.DEFINE_bool(
    "attack", True, "Run the attack variants (atp_step, atp_steps, atp_compile, attack_example) when selected."
)
_ROWS = flags.DEFINE_integer("rows", 10, "Data rows of the synthetic attack table.")
_COLS = flags.DEFINE_integer("cols", 5, "Columns of the synthetic attack table.")
_RESTARTS = flags.DEFINE_integer(
    "restarts", 4, "R of the multi-restart ATP variants (atp_r<R>, compared with R = 1, and atp_step_r<R>)."
)
_ATTACK_PRESET = flags.DEFINE_string("attack_preset", "paper", "Preset of the whole attack timed by attack_example.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "Greedy tokens per generation run (attack_example).")
_TRAIN_BATCH = flags.DEFINE_integer(
    "train_batch", 4, "Examples per training step (train_step, adversarial_train_step), each a synthetic table."
)
_TRAIN_ATTACK = flags.DEFINE_string(
    "train_attack",
    "atp_joint",
    "The inner attack of adversarial_train_step, run on every batch example: any preset spec.",
)
_LORA_RANK = flags.DEFINE_integer(
    "lora_rank",
    0,
    "The training variants: 0 fine-tunes every parameter; R >= 1 trains rank-R adapters (atp_jax.train).",
)
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "Write a jax.profiler trace of one extra, untimed round of all variants here."
)


def _selected_variants(torch_available: bool) -> list[str]:
    unknown = sorted(set(_VARIANTS.value) - set(VARIANTS))
    if unknown:
        raise app.UsageError(f"unknown --variants {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    explicit = flags.FLAGS["variants"].present
    selected = [v for v in VARIANTS if v in _VARIANTS.value]
    if not _ATTACK.value:
        selected = [v for v in selected if v not in ATTACK_VARIANTS]
    if not torch_available:
        wanted = [v for v in selected if v in TORCH_VARIANTS]
        if wanted and explicit:
            raise app.UsageError(f"{', '.join(wanted)} need PyTorch: pip install -e '.[dev]'")
        if wanted:
            print("PyTorch is not installed: skipping", ", ".join(wanted))
        selected = [v for v in selected if v not in TORCH_VARIANTS]
    return selected


def _weight_figures(loaded) -> dict:
    """The weights' size and the most any one device holds of them (GB = 1e9 bytes)."""
    state = nnx.state(loaded.model)
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    per_device = device_bytes(state)
    return {
        "mesh_devices": len(per_device),
        "weights_gb": total / 1e9,
        "weights_per_device_gb_max": max(per_device.values()) / 1e9,
        "weights_per_device_over_total": max(per_device.values()) / total,
    }


def _step_memory(loaded, problem, restarts: int) -> dict:
    """Per-device memory of one ATP step with ``restarts`` restarts (``_atp_memory``)."""
    from atp_jax.attack.presets import preset

    cfg = dataclasses.replace(preset("paper"), n_attack=1, restarts=restarts)
    return _atp_memory(f"atp_r{restarts}_step", loaded, problem, cfg)


def _atp_memory(prefix: str, loaded, problem, cfg) -> dict:
    """Per-device memory of the ATP program ``cfg`` runs on ``problem``, from XLA's buffer assignment of the
    compiled program (per device on a mesh): its arguments (weight shards, the example's tensors), outputs and
    temporaries."""
    from atp_jax.attack.atp import lower_atp

    keys = place_batch(jax.random.split(jax.random.key(0), cfg.restarts), loaded.mesh)
    return _compiled_memory(prefix, lower_atp(loaded.model, problem.tensors, keys, cfg).compile(), loaded)


def _compiled_memory(prefix: str, compiled, loaded) -> dict:
    """``<prefix>_device_{arguments,temp,peak}_gb`` and ``<prefix>_device_peak_over_weights`` of a compiled program,
    from XLA's buffer assignment (per device on a mesh): arguments + outputs + temporaries − the outputs that alias
    an argument; none where the backend gives no analysis."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return {}
    peak = (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.state(loaded.model)))
    return {
        f"{prefix}_device_arguments_gb": analysis.argument_size_in_bytes / 1e9,
        f"{prefix}_device_temp_gb": analysis.temp_size_in_bytes / 1e9,
        f"{prefix}_device_peak_gb": peak / 1e9,
        f"{prefix}_device_peak_over_weights": peak / total,
    }


def _measured_device_peak() -> dict:
    """The largest peak memory any local device reports (GPU, TPU; the CPU backend reports none)."""
    stats = [d.memory_stats() for d in jax.local_devices()]
    measured = [s["peak_bytes_in_use"] for s in stats if s and "peak_bytes_in_use" in s]
    return {"device_peak_bytes_in_use_gb_max": max(measured) / 1e9} if measured else {}


def _synthetic_example(seed: int = 0):
    """A ``--rows`` x ``--cols`` table of random words and numbers with a one-cell answer; ``seed`` 0 is the table
    of the attack variants, other seeds other cells of the same shape."""
    from atp_jax.tables.table import Example, Table

    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "omega", "red", "blue", "north", "south", "river"]
    rows = [[f"{rng.choice(words)} {rng.integers(0, 1000)}" for _ in range(_COLS.value)] for _ in range(_ROWS.value)]
    table = Table([f"Col {j}" for j in range(_COLS.value)], rows)
    return Example("Which row comes first?", table, [table.rows[0][0]], "bench" if seed == 0 else f"bench{seed}")


def _jax_variants(model, ids, targets):
    """fwd and fwd_bwd: the forward, and its loss's gradient to the input embeddings (all weights fixed).

    Both return their result, blocked on; fwd_bwd's is (loss, gradient).
    """
    S, P = ids.shape[1], targets.shape[1]
    positions = jnp.arange(S)[None]
    mask = jnp.ones((1, S), bool)
    answer_positions = jnp.arange(S - P - 1, S - 1)[None]  # logits that predict the last P tokens
    embeds = model.embed(ids)

    @jax.jit
    def forward(m, e):
        return m(e, positions, mask, logits_positions=answer_positions).logits

    def loss(e, m):
        logits = m(e, positions, mask, logits_positions=answer_positions).logits
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    fwd_bwd = jax.jit(jax.value_and_grad(loss))
    return {
        "fwd": lambda: jax.block_until_ready(forward(model, embeds)),
        "fwd_bwd": lambda: jax.block_until_ready(fwd_bwd(embeds, model)),
    }


def _matmul_variants(dtype):
    """Square matmuls of each size in MATMUL_SIZES, for the device's reachable matmul throughput.

    One call chains 16 products on an accelerator, so that the figure is not the dispatch overhead of
    a sub-millisecond kernel; on the CPU one product already takes long enough.
    Default precision, as the model's own matmuls use (e.g. TF32 for float32 on recent NVIDIA GPUs).
    """
    chain = 1 if jax.default_backend() == "cpu" else 16

    @jax.jit
    def chained(a, b):
        # Each product feeds the next, so XLA cannot compute one product for all; the rescale keeps
        # the values of unit size (no overflow to inf along the chain).
        scale = a.shape[0] ** -0.5
        return jax.lax.fori_loop(0, chain, lambda _, c: (c @ b) * scale, a)

    variants = {}
    for n in MATMUL_SIZES:
        a = jax.random.normal(jax.random.key(0), (n, n), dtype)
        b = jax.random.normal(jax.random.key(1), (n, n), dtype)
        variants[f"matmul_{n}"] = lambda a=a, b=b: jax.block_until_ready(chained(a, b))
    return variants, {f"matmul_{n}": chain * 2 * n**3 for n in MATMUL_SIZES}


def _torch_model(loaded, device, dtype):
    """transformers' PyTorch model of ``loaded.config`` holding a copy of ``loaded``'s weights.

    The config goes over as ``ModelConfig.to_hf()`` and the weights as ``export_hf`` (HF names, (out, in)).
    The final check makes sure every parameter of the torch model was written (a tied head is one parameter
    there, as here).
    """
    import torch
    import transformers
    from transformers.initialization import no_init_weights

    hf_config = transformers.AutoConfig.for_model(**loaded.config.to_hf())
    with torch.device(device), no_init_weights():  # the weights are copied in below: skip the random init
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    model.tie_weights()  # skipped with the init above; a tied head then is the embedding parameter itself
    model = model.to(dtype).eval().requires_grad_(False)

    targets = dict(model.named_parameters())
    weights = export_hf(loaded.model)
    unexpected = sorted(set(weights) - set(targets))
    missing = sorted(set(targets) - set(weights))
    if unexpected or missing:
        raise ValueError(
            f"{loaded.name}: transformers' {type(model).__name__} has other parameters than the JAX "
            f"model (not in torch: {unexpected[:5]}; not in JAX: {missing[:5]})"
        )
    with torch.no_grad():
        for name, array in weights.items():
            # Through float32: torch accepts no numpy bfloat16; copy_ casts to the parameter's dtype.
            targets[name].copy_(torch.from_numpy(np.array(array, np.float32)))
    return model


def _torch_variants(loaded, ids, targets, selected, model=None, job="fwd_bwd"):
    """The fwd_bwd of ``_jax_variants`` in transformers' PyTorch model on the same weights and prompt:
    eager, and under ``torch.compile`` (whose first call compiles the forward and the backward), named
    ``torch_<job>`` and ``torch_compile_<job>``.

    On a CUDA machine with a CUDA build of torch the model runs on the GPU, else on the CPU. Returns the
    runs, a description of the device, and the torch model (pass it back in to reuse its weights).
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[flags.FLAGS.dtype]
    if model is None:
        model = _torch_model(loaded, device, dtype)
    S, P = ids.shape[1], targets.shape[1]
    ids_t = torch.as_tensor(np.array(ids), device=device)
    targets_t = torch.as_tensor(np.array(targets[0]), device=device, dtype=torch.long)
    answer_positions = torch.arange(S - P - 1, S - 1, device=device)
    embeds = model.get_input_embeddings()(ids_t)

    def fwd_bwd(forward):
        inputs = embeds.detach().requires_grad_(True)  # the only tensor that gets a gradient
        logits = forward(inputs_embeds=inputs, logits_to_keep=answer_positions, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[0].float(), targets_t)
        (grad,) = torch.autograd.grad(loss, inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        return loss.item(), grad

    runs = {}
    if "torch_fwd_bwd" in selected:
        runs[f"torch_{job}"] = lambda: fwd_bwd(model)
    if "torch_compile_fwd_bwd" in selected:
        compiled = torch.compile(model)  # compiles lazily, on its first call
        runs[f"torch_compile_{job}"] = lambda: fwd_bwd(compiled)
    return runs, f"{device}, attention {model.config._attn_implementation}", model


def _one_step_variant(loaded, problem) -> dict:
    """``atp_step_r<R>``: one step of the paper's recipe with ``--restarts`` restarts (host Hungarian), the unit
    of an attack's cost."""
    from atp_jax.attack.atp import run_atp
    from atp_jax.attack.presets import preset

    cfg = dataclasses.replace(preset("paper"), n_attack=1, restarts=_RESTARTS.value)
    keys = place_batch(jax.random.split(jax.random.key(0), cfg.restarts), loaded.mesh)
    run = functools.partial(run_atp, loaded.model, problem.tensors, keys, cfg)
    return {f"atp_step_r{cfg.restarts}": lambda: jax.block_until_ready(run())}


def _attack_step_variants(loaded, problem):
    """ATP runs of 1 and 5 steps (R = 1 and ``--restarts``, host and device Hungarian) and the plain whole-prompt
    forward+backward of the same unpermuted prompt, the yardstick of one step.

    Also returns that prompt's ids ``[1, S]`` and answer ids ``[1, A]`` (its last A tokens), so the
    torch variants can do the same job.
    """
    from atp_jax.attack.atp import run_atp
    from atp_jax.attack.presets import preset

    layout = problem.layout
    ids = jnp.asarray(layout.ids())[None]
    S = ids.shape[1]
    answer_positions = jnp.asarray(layout.prefix_length + layout.answer_logit_positions())[None]
    targets = jnp.asarray(layout.answer_ids)[None]

    def loss(e, m):
        logits = m(e, jnp.arange(S)[None], jnp.ones((1, S), bool), logits_positions=answer_positions).logits
        return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1).mean()

    fwd_bwd = jax.jit(jax.value_and_grad(loss))
    embeds = loaded.model.embed(ids)
    variants = {"prompt_fwd_bwd": lambda: jax.block_until_ready(fwd_bwd(embeds, loaded.model))}
    base = preset("paper")
    runs = (("atp", 1, "host"), (f"atp_r{_RESTARTS.value}", _RESTARTS.value, "host"), ("atp_device", 1, "device"))
    for name, restarts, hungarian in runs:
        for steps in (1, 5):
            cfg = dataclasses.replace(base, n_attack=steps, restarts=restarts, hungarian=hungarian)
            keys = place_batch(jax.random.split(jax.random.key(0), restarts), loaded.mesh)
            variants[f"{name}_{steps}steps"] = lambda cfg=cfg, keys=keys: jax.block_until_ready(
                run_atp(loaded.model, problem.tensors, keys, cfg)
            )
    return variants, ids, targets


def _compile_variant(loaded, example) -> dict:
    """``atp_compile``: tracing, lowering and compiling the ``--attack_preset`` ATP program for the example's
    shape bucket, anew each time (the program's in-memory caches cleared; ``atp-benchmark`` does not turn the
    persistent cache on, and JAX does not keep a program with a host callback there on a CPU) — what a sweep pays
    once per bucket."""
    from atp_jax.attack.atp import lower_atp
    from atp_jax.attack.problem import make_problem

    config = atp_jax.preset(_ATTACK_PRESET.value)  # an ATP preset: checked in main, before the model loads
    problem = make_problem(loaded, example)  # the default bucket grid, as a sweep uses
    keys = place_batch(jax.random.split(jax.random.key(config.seed), config.restarts), loaded.mesh)

    def compile_once():  # drops this program's caches only: the other variants keep theirs
        lower_atp(loaded.model, problem.tensors, keys, config, fresh=True).compile()

    return {"atp_compile": compile_once}


def _attack_example_variants(loaded, example, ids):
    """One whole ``atp_jax.attack`` (``--attack_preset``, by default ``paper``: prompt set-up, 20 steps,
    result) and greedy generation of ``--new_tokens`` after the ``--tokens`` random-id prompt (prefill
    included)."""
    from atp_jax.inference.generate import generate_ids

    prompt = np.asarray(ids[0]).tolist()
    config = atp_jax.preset(_ATTACK_PRESET.value)
    return {
        "attack_example": lambda: atp_jax.attack(loaded, example, config),
        "generate": lambda: generate_ids(loaded, [prompt], _NEW_TOKENS.value),
    }


def _train_config():
    """The training variants' ``TrainConfig`` from ``--train_attack``, ``--train_batch`` and ``--lora_rank``;
    ``app.UsageError`` naming the flag for a bad value."""
    from atp_jax.attack.problem import AttackInputError
    from atp_jax.attack.run import check_mode
    from atp_jax.train.trainer import TrainConfig

    if _TRAIN_BATCH.value < 1:
        raise app.UsageError(f"--train_batch {_TRAIN_BATCH.value}: give 1 or more examples per training step")
    if _LORA_RANK.value < 0:
        raise app.UsageError(f"--lora_rank {_LORA_RANK.value}: give 0 (full fine-tune) or an adapter rank >= 1")
    try:
        config = TrainConfig(attack=_TRAIN_ATTACK.value, batch_size=_TRAIN_BATCH.value, lora_rank=_LORA_RANK.value)
        if not config.is_clean:
            check_mode(_synthetic_example(), config.attack_config)
    except (ValueError, AttackInputError) as e:
        raise app.UsageError(
            f"--train_attack {_TRAIN_ATTACK.value} on a {_ROWS.value}x{_COLS.value} table: {e}; give another preset "
            "spec, or more --rows/--cols"
        ) from e
    return config


def _train_variants(loaded, config) -> tuple[dict, dict, Callable[[], dict]]:
    """``train_step`` and ``adversarial_train_step``: one AdamW step of ``atp_jax.train`` on ``--train_batch``
    synthetic tables of ``--rows`` x ``--cols`` (``[B, S]`` ids, S the text bucket of the longest prompt + answer).

    ``train_step`` is a clean fine-tune's step: tokenizing each example's prompt in the original order and its
    answer, the padded batch, ``train_step``. ``adversarial_train_step`` first runs ``config``'s inner attack on
    every example with the current weights and tokenizes the prompt over the order it found, as
    ``atp_jax.train.trainer.train`` does. Both take their step on one shared trained state (a second copy of the
    trainable parameters and Adam's moments would double the memory measured) and, as the trainer does, leave
    the attacked model on the new weights (LoRA: the adapters merged into the kernels), so every attack runs on
    the weights of its step. Each run returns the batch's loss, blocked on with the new state.

    Also returns figures (the batch's shape, the trainable parameters' size) and a function giving the compiled
    training step's per-device memory on the clean batch from XLA's buffer assignment (``train_step_device_*``)
    and, for an ATP inner attack, its program's (``inner_attack_device_*``) and the adversarial step's peak (the
    larger): to be called after the timed runs, since JAX keeps the program it compiles and the first call would
    reuse it.
    """
    from atp_jax.attack.atp import ATPConfig
    from atp_jax.attack.presets import canonical
    from atp_jax.attack.problem import make_problem
    from atp_jax.inference.qa import prompt_ids
    from atp_jax.sharding import DATA, axis_size
    from atp_jax.tables.prompt import encode_text, reference_answer
    from atp_jax.train import step as train_lib
    from atp_jax.train.trainer import make_batch

    step_config = config.step_config
    attack_config = config.attack_config
    examples = [_synthetic_example(seed) for seed in range(config.batch_size)]
    data = axis_size(loaded.mesh, DATA)
    batch_rows = -(-config.batch_size // data) * data  # rows divide over the data axis; the padding rows count zero

    @functools.partial(jax.jit, static_argnames="lora")
    def merged_layers(model, params, lora):
        return train_lib.trained_model(model, params, train_lib.TrainStepConfig(lora=lora)).layers.weights()

    def weights(params) -> dict:
        """What the attacked model's weights become: ``params`` (full) or the merged kernels placed as the base's."""
        if step_config.lora is None:
            return params
        base = loaded.model.layers.weights()
        merged = merged_layers(loaded.model, params, step_config.lora)
        return {"layers": {name: jax.device_put(value, base[name].sharding) for name, value in merged.items()}}

    params = train_lib.init_params(loaded.model, step_config, jax.random.key(config.seed))
    state = {"params": params, "opt_state": train_lib.init_optimizer(params, step_config)}
    current = dataclasses.replace(loaded, model=train_lib.with_weights(loaded.model, weights(params)))

    def batch(adversarial: bool):
        rows = []
        for seed, example in enumerate(examples):
            table = example.table
            if adversarial and not config.is_clean:
                result = atp_jax.attack(current, example, dataclasses.replace(attack_config, seed=seed), config.style)
                table = table.permute(result.row_perm, result.col_perm)
            target = encode_text(current.tokenizer, reference_answer(example))
            rows.append((prompt_ids(current, example, table, config.style), target))
        return train_lib.place(make_batch(rows, batch_rows), loaded.mesh)

    def step(adversarial: bool) -> float:
        params, opt_state, loss, _ = train_lib.train_step(
            loaded.model, state["params"], state["opt_state"], batch(adversarial), step_config
        )
        state.update(params=params, opt_state=opt_state)
        nnx.update(current.model, weights(params))
        jax.block_until_ready((params, opt_state, nnx.state(current.model)))
        return float(loss)

    def memory() -> dict:
        # The program train_step runs, lowered and compiled for its buffer assignment (the private names are the
        # jitted step itself and the placement it is called with: the same program, not a look-alike).
        placement = train_lib._placement((state["params"], state["opt_state"]))
        compiled = train_lib._train_step.lower(
            loaded.model,
            state["params"],
            state["opt_state"],
            clean,
            train_lib.settings(step_config),
            step_config.lora,
            placement,
        ).compile()
        figures = _compiled_memory("train_step", compiled, loaded)
        # An adversarial step runs the inner attack's program, then the training step's, each holding the weights:
        # its peak is the larger of the two. ATP's program is the one that can outgrow the step (a backward per
        # restart); the searches' forwards are the scoring programs of inference.
        if isinstance(attack_config, ATPConfig) and figures:
            problem = make_problem(current, examples[0], config.style)
            inner = _atp_memory("inner_attack", current, problem, attack_config)
            figures.update(inner)
            figures["adversarial_train_step_device_peak_gb"] = max(
                figures["train_step_device_peak_gb"], inner.get("inner_attack_device_peak_gb", 0.0)
            )
        return figures

    clean = batch(adversarial=False)
    figures = {
        "train_batch_shape": "x".join(map(str, clean.ids.shape)),
        "train_attack": canonical(config.attack),
        "train_lora_rank": config.lora_rank,
        "train_trainable_gb": sum(leaf.nbytes for leaf in jax.tree.leaves(state["params"])) / 1e9,
    }
    variants = {"train_step": lambda: step(False), "adversarial_train_step": lambda: step(True)}
    return variants, figures, memory


def _forward_flops(config, tokens: int, loss_positions: int) -> float:
    """≈ FLOPs of one forward: 2 per decoder weight per token, plus the vocabulary head at the loss
    positions only. Attention's token-by-token products are left out (a few % at a few hundred
    tokens). A backward to the inputs alone (no weight gradients) costs about one more forward."""
    return 2 * parameter_counts(config)["layers"] * tokens + 2 * config.hidden_size * config.vocab_size * loss_positions


def _step_figures(medians: dict) -> dict:
    """Per-step cost = (5-step run − 1-step run) / 4, which removes set-up and final projection."""
    out = {}
    multi = f"atp_r{_RESTARTS.value}"
    for name in ("atp", multi, "atp_device"):
        out[f"{name}_step_s"] = (medians[f"{name}_5steps"] - medians[f"{name}_1steps"]) / 4
    out["atp_step_over_prompt_fwd_bwd"] = out["atp_step_s"] / medians["prompt_fwd_bwd"]
    out[f"{multi}_step_over_r1"] = out[f"{multi}_step_s"] / out["atp_step_s"]
    out["device_hungarian_step_over_host"] = out["atp_device_step_s"] / out["atp_step_s"]
    return out


def _derived_figures(loaded, medians: dict, first: dict, matmul_flops: dict) -> dict:
    """Throughputs and ratios from the medians, and the agreement of the torch and JAX losses."""
    out = {}
    for n, flops in matmul_flops.items():
        out[f"{n}_gflop_per_s"] = flops / medians[n] / 1e9
    peak = max((out[f"{n}_gflop_per_s"] for n in matmul_flops), default=None)
    if peak:
        out["matmul_peak_gflop_per_s"] = peak
    forward = _forward_flops(loaded.config, _TOKENS.value, _ANSWER_TOKENS.value)
    for name, flops in (("fwd", forward), ("fwd_bwd", 2 * forward)):
        if name in medians:
            out[f"{name}_model_gflop_per_s"] = flops / medians[name] / 1e9
            if peak:
                out[f"{name}_fraction_of_matmul_peak"] = out[f"{name}_model_gflop_per_s"] / peak
    for name in TORCH_VARIANTS:
        if name in medians and "fwd_bwd" in medians:
            out[f"{name}_over_jax_fwd_bwd"] = medians[name] / medians["fwd_bwd"]
            out[f"{name}_loss_minus_jax"] = first[name][0] - float(first["fwd_bwd"][0])
    if "prompt_fwd_bwd" in medians:
        out.update(_step_figures(medians))
        for name in ("torch_prompt_fwd_bwd", "torch_compile_prompt_fwd_bwd"):
            if name in medians:
                out[f"{name}_over_atp_step"] = medians[name] / out["atp_step_s"]
                out[f"{name}_loss_minus_jax"] = first[name][0] - float(first["prompt_fwd_bwd"][0])
    if "train_step" in medians and "adversarial_train_step" in medians:
        out["adversarial_train_step_over_train_step"] = medians["adversarial_train_step"] / medians["train_step"]
    if "generate" in medians:
        generated = len(first["generate"][0])  # greedy, so every run emits the same tokens
        out["generate_new_tokens"] = generated
        out["generate_tokens_per_s"] = generated / medians["generate"]
    return out


def _round(value):
    return float(f"{value:.4g}") if isinstance(value, float) else value


def main(argv):
    del argv
    selected = _selected_variants(importlib.util.find_spec("torch") is not None)
    dtype = model_flags.DTYPES[flags.FLAGS.dtype]
    if _RESTARTS.value < 2 and "atp_steps" in selected:
        raise app.UsageError(f"--restarts {_RESTARTS.value}: atp_steps' multi-restart variant needs R >= 2")
    try:
        attack_config = atp_jax.preset(_ATTACK_PRESET.value)  # an unknown name stops here, before the model loads
    except ValueError as e:
        raise app.UsageError(f"--attack_preset: {e}") from e
    from atp_jax.attack.atp import ATPConfig

    if "atp_compile" in selected and not isinstance(attack_config, ATPConfig):
        if flags.FLAGS["variants"].present:
            raise app.UsageError(
                f"--attack_preset {_ATTACK_PRESET.value}: the atp_compile variant times an ATP program; "
                "give an ATP preset (atp_joint, paper, ...) or leave atp_compile out of --variants"
            )
        print(f"--attack_preset {_ATTACK_PRESET.value} is not ATP: skipping atp_compile")
        selected = [v for v in selected if v != "atp_compile"]
    train_config = _train_config() if any(v in selected for v in TRAIN_VARIANTS) else None
    mesh = model_flags.check_model_flags()
    loaded = model_flags.load_model_from_flags(mesh=mesh)
    peak_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if loaded.tokenizer is None and any(v in selected for v in TEXT_VARIANTS):
        print(f"{loaded.name} has no tokenizer: skipping", ", ".join(v for v in TEXT_VARIANTS if v in selected))
        selected = [v for v in selected if v not in TEXT_VARIANTS]
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, loaded.config.vocab_size, (1, _TOKENS.value)), jnp.int32)
    targets = ids[:, -_ANSWER_TOKENS.value :]

    figures = {
        "model": loaded.name,
        "source": loaded.source,
        "dtype": flags.FLAGS.dtype,
        "mesh": describe(mesh),
        "tokens": _TOKENS.value,
        "answer_tokens": _ANSWER_TOKENS.value,
        "devices": str(jax.devices()),
        "load_s": round(loaded.load_seconds, 2),
        "peak_rss_after_load_gib": round(peak_rss_gib, 2),
        **_weight_figures(loaded),
    }
    variants, matmul_flops, train_memory = {}, {}, None
    variants.update({n: run for n, run in _jax_variants(loaded.model, ids, targets).items() if n in selected})
    if "matmul_peak" in selected:
        more, matmul_flops = _matmul_variants(dtype)
        variants.update(more)
    torch_selected, torch_model = [v for v in TORCH_VARIANTS if v in selected], None
    if torch_selected:
        more, torch_device, torch_model = _torch_variants(loaded, ids, targets, torch_selected)
        variants.update(more)
        figures["torch_device"] = torch_device
    if any(v in selected for v in ATTACK_VARIANTS):
        example = _synthetic_example()
        figures["attack_table"] = f"{_ROWS.value}x{_COLS.value}"
        figures["attack_preset"] = _ATTACK_PRESET.value
        if "atp_step" in selected or "atp_steps" in selected:
            from atp_jax.attack.problem import make_problem

            problem = make_problem(loaded, example, buckets=None)  # exact sizes: the same tokens as the yardstick
            figures["attack_prompt_tokens"] = problem.layout.seq_length
            figures.update(_step_memory(loaded, problem, _RESTARTS.value))
        if "atp_step" in selected:
            variants.update(_one_step_variant(loaded, problem))
        if "atp_steps" in selected:
            more, prompt_ids, answer_ids = _attack_step_variants(loaded, problem)
            variants.update(more)
            if torch_selected:  # torch doing one step's work on the attack prompt: the comparison users make
                more, _, _ = _torch_variants(
                    loaded, prompt_ids, answer_ids, torch_selected, torch_model, job="prompt_fwd_bwd"
                )
                variants.update(more)
        if "atp_compile" in selected:
            variants.update(_compile_variant(loaded, example))
        if "attack_example" in selected:
            variants.update(_attack_example_variants(loaded, example, ids))
    if any(v in selected for v in TRAIN_VARIANTS):
        more, train_figures, train_memory = _train_variants(loaded, train_config)
        variants.update({name: run for name, run in more.items() if name in selected})
        figures["train_table"] = f"{_ROWS.value}x{_COLS.value}"
        figures.update(train_figures)

    first, first_call_s = {}, {}
    for name, run in variants.items():
        start = time.perf_counter()
        first[name] = run()
        first_call_s[name] = time.perf_counter() - start
        logging.info("first call of %s: %.2f s", name, first_call_s[name])
    times = {name: [] for name in variants}
    for repeat in range(_REPEATS.value):
        logging.info("timed round %d of %d", repeat + 1, _REPEATS.value)
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    if _PROFILE_DIR.value:
        # An extra round, so that tracing overhead stays out of the medians.
        with jax.profiler.trace(_PROFILE_DIR.value):
            for name, run in variants.items():
                with jax.profiler.TraceAnnotation(name):
                    run()

    if train_memory is not None:
        figures.update(train_memory())
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name in variants:
        figures[f"{name}_median_s"] = medians[name]
        figures[f"{name}_first_call_s"] = first_call_s[name]
    figures.update(_derived_figures(loaded, medians, first, matmul_flops))
    figures.update(_measured_device_peak())
    figures = {key: _round(value) for key, value in figures.items()}

    print("| variant | first call (s) | median (s) | min (s) |\n|---|---|---|---|")
    for name in variants:
        first_call, median = figures[f"{name}_first_call_s"], figures[f"{name}_median_s"]
        print(f"| {name} | {first_call} | {median} | {_round(min(times[name]))} |")
    print("\n| figure | value |\n|---|---|")
    for key, value in figures.items():
        if not key.endswith(("_median_s", "_first_call_s")):
            print(f"| {key} | {value} |")
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(figures, f, indent=2)


def run() -> None:
    """The console script ``atp-benchmark``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
