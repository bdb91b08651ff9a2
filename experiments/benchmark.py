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


def main(argv):
    del argv
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[_DTYPE.value]
    loaded = atp_jax.load_model(_MODEL.value, dtype=dtype)
    peak_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, loaded.config.vocab_size, (1, _TOKENS.value)), jnp.int32)
    variants = _variants(loaded.model, ids, ids[:, -_ANSWER_TOKENS.value:])

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
    print("| figure | value |\n|---|---|")
    for key, value in figures.items():
        print(f"| {key} | {value} |")
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    app.run(main)
