"""How far a victim server's CE is from the in-process model's on the same weights (the black-box victim's check).

Serve a model with any OpenAI-compatible server, then compare, question by question, the reference answer's CE
under the original and the reversed order from the server (both log-probability routes, ``echo`` and ``forced``)
and from the in-process JAX model:

  python -m llama_cpp.server --model SmolLM2-135M-Instruct.Q4_1.gguf --model_alias smollm2 --port 8000 &
  atp-server-agreement --victim_url http://127.0.0.1:8000 --victim_name smollm2 --model smollm2-135m-instruct

Prints a markdown table (one row per question and order) and the largest difference.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from absl import flags

from atp_jax.cli import selection, victim_flags
from atp_jax.cli.console import run_app
from atp_jax.cli.model_flags import define_model_flags, load_model_from_flags
from atp_jax.http_client import RequestPolicy
from atp_jax.inference.qa import answer_losses
from atp_jax.inference.server import ServerVictim, VictimError
from atp_jax.runs.report import markdown_table

selection.define_flags(num_examples=3, max_rows=8, max_cols=5)
define_model_flags("smollm2-135m-instruct")
victim_flags.define_victim_flags()
flags.DEFINE_list("routes", ["echo", "forced"], "The log-probability routes to compare: echo, forced or both.")
flags.mark_flags_as_required(["victim_url"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    examples = selection.examples(0, 1)
    if not examples:
        sys.exit("no examples selected; loosen --num_examples/--max_rows/--max_cols")
    unknown = [r for r in FLAGS.routes if r not in ("echo", "forced")]
    if unknown or not FLAGS.routes:
        sys.exit(f"--routes {','.join(FLAGS.routes)}: choose echo, forced or both")
    model = load_model_from_flags()
    victims = {
        endpoint: ServerVictim(
            FLAGS.victim_url,
            FLAGS.victim_name,
            endpoint,
            model.tokenizer,
            max_concurrency=1,
            policy=RequestPolicy(deadline=FLAGS.victim_deadline, attempt_timeout=FLAGS.victim_deadline),
        )
        for endpoint in FLAGS.routes
    }
    rows, seconds = [], {endpoint: [] for endpoint in victims}
    for example in examples:
        n, m = example.table.n_rows, example.table.n_cols
        orders = {"original": example.table, "reversed": example.table.permute(np.arange(n)[::-1], np.arange(m)[::-1])}
        local = answer_losses(model, example, list(orders.values()))
        served = {}
        for endpoint, victim in victims.items():
            before, start = victim.stats(), time.perf_counter()
            try:
                served[endpoint] = victim.answer_losses(example, list(orders.values()))
            except VictimError as e:
                sys.exit(str(e))
            seconds[endpoint].append((time.perf_counter() - start) / max(1, (victim.stats() - before).requests))
        for k, order in enumerate(orders):
            rows.append(
                {
                    "id": example.id,
                    "order": order,
                    "CE (JAX)": f"{local[k]:.4f}",
                    **{f"CE ({e})": f"{served[e][k]:.4f}" for e in served},
                    "max |Δ|": f"{max(abs(served[e][k] - local[k]) for e in served):.4f}",
                }
            )
    print(markdown_table(rows))
    worst = max(float(r["max |Δ|"]) for r in rows)
    per_request = {e: float(np.median(s)) for e, s in seconds.items()}
    print(f"\nlargest |CE(server) - CE(JAX)|: {worst:.4f} nats over {len(rows)} prompts")
    print("median seconds per request: " + ", ".join(f"{e} {s:.2f}" for e, s in per_request.items()))


def run() -> None:
    """The console script ``atp-server-agreement``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
