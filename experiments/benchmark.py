"""Where the time goes: model load, forward and forward+backward to the input embeddings.

Variants run in one process, alternating round by round so machine drift hits all alike; each figure
is the median of ``--repeats`` runs after a warm-up, with compile time reported separately.

  python experiments/benchmark.py --model smollm2-135m-instruct --tokens 256
"""

from __future__ import annotations

import json
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import atp_jax

_MODEL = flags.DEFINE_string("model", atp_jax.DEFAULT_MODEL, "Zoo name, HF model directory or .gguf file.")
_TOKENS = flags.DEFINE_integer("tokens", 256, "Prompt length.")
_ANSWER_TOKENS = flags.DEFINE_integer("answer_tokens", 8, "Positions that get logits / loss.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per variant (median reported).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter dtype.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the figures as JSON here.")
_ATTACK = flags.DEFINE_bool("attack", True, "Also time ATP steps on a --rows x --cols table.")
_ROWS = flags.DEFINE_integer("rows", 10, "Data rows of the synthetic attack table.")
_COLS = flags.DEFINE_integer("cols", 5, "Columns of the synthetic attack table.")


def _variants(model, ids, targets):
    """Benchmark name -> zero-argument callable that blocks until its result is ready."""
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


def _attack_variants(loaded):
    """ATP runs of 1 and 5 steps (R = 1 and 4, host and device Hungarian) and the plain whole-prompt
    forward+backward of the same unpermuted prompt, the yardstick of one step."""
    import dataclasses

    from atp_jax.attack.atp import run_atp
    from atp_jax.attack.config import preset
    from atp_jax.attack.problem import make_problem
    from atp_jax.tables.table import Example, Table

    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "omega", "red", "blue", "north", "south", "river"]
    table = Table([f"Col {j}" for j in range(_COLS.value)],
                  [[f"{rng.choice(words)} {rng.integers(0, 1000)}" for _ in range(_COLS.value)] for _ in range(_ROWS.value)])
    example = Example("Which row comes first?", table, [table.rows[0][0]], "bench")
    problem = make_problem(loaded, example)
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
    for name, restarts, hungarian in (("atp", 1, "host"), ("atp_r4", 4, "host"), ("atp_device", 1, "device")):
        for steps in (1, 5):
            cfg = dataclasses.replace(base, n_attack=steps, restarts=restarts, hungarian=hungarian)
            keys = jax.random.split(jax.random.key(0), restarts)
            variants[f"{name}_{steps}steps"] = (
                lambda cfg=cfg, keys=keys: jax.block_until_ready(run_atp(loaded.model, problem.tensors, keys, cfg))
            )
    return variants, S


def _step_figures(medians: dict) -> dict:
    """Per-step cost = (5-step run − 1-step run) / 4, which removes set-up and final projection."""
    out = {}
    for name in ("atp", "atp_r4", "atp_device"):
        out[f"{name}_step_s"] = (medians[f"{name}_5steps"] - medians[f"{name}_1steps"]) / 4
    out["atp_step_over_prompt_fwd_bwd"] = out["atp_step_s"] / medians["prompt_fwd_bwd"]
    out["atp_r4_step_over_r1"] = out["atp_r4_step_s"] / out["atp_step_s"]
    out["device_hungarian_step_over_host"] = out["atp_device_step_s"] / out["atp_step_s"]
    return {k: round(v, 3) for k, v in out.items()}


def main(argv):
    del argv
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[_DTYPE.value]
    loaded = atp_jax.load_model(_MODEL.value, dtype=dtype)
    peak_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, loaded.config.vocab_size, (1, _TOKENS.value)), jnp.int32)
    variants = _variants(loaded.model, ids, ids[:, -_ANSWER_TOKENS.value:])
    attack_tokens = None
    if _ATTACK.value:
        more, attack_tokens = _attack_variants(loaded)
        variants.update(more)

    compile_s = {}
    for name, run in variants.items():
        start = time.perf_counter()
        run()
        compile_s[name] = time.perf_counter() - start
    times = {name: [] for name in variants}
    for _ in range(_REPEATS.value):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)

    figures = {
        "model": loaded.name, "dtype": _DTYPE.value, "tokens": _TOKENS.value, "devices": str(jax.devices()),
        "load_s": round(loaded.load_seconds, 2), "peak_rss_after_load_gib": round(peak_rss_gib, 2),
        **{f"{n}_median_s": round(statistics.median(t), 3) for n, t in times.items()},
        **{f"{n}_first_call_s": round(s, 2) for n, s in compile_s.items()},
    }
    if attack_tokens:
        figures["attack_table"] = f"{_ROWS.value}x{_COLS.value}, {attack_tokens} tokens"
        figures.update(_step_figures({n: statistics.median(t) for n, t in times.items()}))
    print("| figure | value |\n|---|---|")
    for key, value in figures.items():
        print(f"| {key} | {value} |")
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    app.run(main)
